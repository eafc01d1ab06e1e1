"""Checksums of checkpoint items, in-process: written after the data and before the step is renamed
into place, verified before a read, in the persistent (orbax) tier and the per-host local tier; a
mismatch names step, item and file."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.averaging import ema as ema_lib
from dew.checkpointing import Checkpoints
from dew.checkpointing.errors import CheckpointDamagedError
from dew.checkpointing.step_files import CHECKSUMS
from dew.training.state import TrainState


def state_at(step: int) -> TrainState:
    params = {"w": jnp.arange(64, dtype=jnp.float32).reshape(8, 8) + step, "b": jnp.ones((8,))}
    opt = optax.adam(1e-3)
    return TrainState(
        step=jnp.asarray(step, jnp.int32),
        params=params,
        opt_state=opt.init(params),
        ema=ema_lib.zeros_like(params),
        rng=jax.random.PRNGKey(0),
    )


def largest_file(directory):
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.fixture
def saved(tmp_path):
    checkpoints = Checkpoints(
        str(tmp_path / "checkpoints"), keep=None, local_directory=str(tmp_path / "local"), local_every=1
    )
    checkpoints.save(2, state_at(2), None)
    checkpoints.save(4, state_at(4), None)
    checkpoints.save_local(5, state_at(5), None)
    checkpoints.wait()
    return checkpoints, tmp_path


def test_every_item_carries_checksums_and_an_intact_step_verifies(saved):
    checkpoints, root = saved
    for item in ("params", "opt_state", "ema_params", "extra"):
        assert (root / "checkpoints" / "4" / item / CHECKSUMS).is_file()
    checkpoints.verify(4)
    checkpoints.verify(5)  # the local step
    state, _ = checkpoints.restore(None, 4)
    np.testing.assert_array_equal(state.params["w"], np.asarray(state_at(4).params["w"]))


def test_one_flipped_bit_is_caught_before_the_restore_reads_it(saved):
    checkpoints, root = saved
    ema_params = root / "checkpoints" / "4" / "ema_params"  # OCDBT's data files, or a leaf's chunks
    victim = largest_file(ema_params / "d") if (ema_params / "d").is_dir() else ema_params / "w" / "0.0"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamagedError) as caught:
        checkpoints.restore(None, 4)
    assert str(caught.value) == (
        f"checkpoint step 4 is damaged: item 'ema_params', file {victim} does not match its checksum "
        "(its bytes changed after it was written)"
    )
    assert (caught.value.step, caught.value.item, caught.value.path) == (4, "ema_params", str(victim))
    checkpoints.restore(None, 2)  # the other steps are untouched


def test_the_checksums_are_inside_the_step_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    """A kill at any moment leaves a visible step checksummed, or no step: at the moment orbax
    renames the temporary step directory to its final name, every item already holds its
    checksums (a kill just before that rename leaves only the temporary directory)."""
    from orbax.checkpoint._src.path import atomicity

    rename = atomicity.AtomicRenameTemporaryPath.finalize
    seen = {}

    async def observed(self, *args, **kwargs):
        if self._final_path.name == "3":  # the step's rename, not an item's
            tmp = pathlib.Path(self.get())
            seen.update({item.name: (item / CHECKSUMS).is_file() for item in tmp.iterdir() if item.is_dir()})
        return await rename(self, *args, **kwargs)

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", observed)
    # orbax writes the step (a small one written directly: tests/test_checkpoints_direct_write.py)
    checkpoints = Checkpoints(str(tmp_path / "checkpoints"), keep=None, ocdbt=True)
    checkpoints.save(3, state_at(3), None)
    checkpoints.wait()
    assert seen == {"params": True, "opt_state": True, "ema_params": True, "extra": True}
    checkpoints.verify(3)


def test_checksums_that_never_landed_make_the_step_incomplete(saved):
    checkpoints, root = saved
    (root / "checkpoints" / "4" / "extra" / CHECKSUMS).unlink()  # an earlier dew killed mid-save
    with pytest.raises(
        CheckpointDamagedError, match=r"checkpoint step 4 is damaged: item 'extra' is incomplete"
    ):
        checkpoints.verify(4)


def test_a_damaged_local_shard_is_named_and_set_aside_not_deleted(saved):
    checkpoints, root = saved
    victim = next((root / "local").rglob("5/leaf0.shard0.npy"))
    damaged = victim.read_bytes()[:-4]
    victim.write_bytes(damaged)
    with pytest.raises(
        CheckpointDamagedError,
        match=r"checkpoint step 5 is damaged: item 'local', file .*leaf0.shard0.npy holds",
    ):
        checkpoints.restore(None, 5)
    aside = pathlib.Path(checkpoints.set_aside_damaged(5))
    assert aside.name.startswith("damaged-5-") and checkpoints.latest == 4
    checkpoints.save_local(6, state_at(6), None)  # the next local save replaces the step before it
    checkpoints.wait()
    assert checkpoints.latest == 6
    assert (aside / "leaf0.shard0.npy").read_bytes() == damaged  # but keeps the damaged one aside


@pytest.mark.parametrize(
    "record, found",
    [
        ('{"files": []}', "found files list"),
        ("[]", "found list"),
        ('{"algorithm": "sha256"}', "found files null"),
        ('{"files": {"a": {"size": "12", "sha256": "00"}}}', "file 'a': expected"),
        ('{"files": {"../../x": {"size": 1, "sha256": "' + "0" * 64 + '"}}}', "is not a path inside"),
        ("[" * 100000, "maximum recursion depth"),
    ],
)
def test_checksums_of_another_shape_are_damage_not_a_crash(saved, record, found):
    """A checksums record that is JSON of another shape (or no JSON a reader could hold) makes
    the step damaged, like a flipped bit, so a restart sets it aside instead of stopping."""
    checkpoints, root = saved
    path = root / "checkpoints" / "4" / "params" / CHECKSUMS
    path.write_text(record)
    with pytest.raises(CheckpointDamagedError) as caught:
        checkpoints.verify(4)
    assert str(caught.value).startswith(
        f"checkpoint step 4 is damaged: item 'params': its checksums {path} are unreadable ("
    )
    assert found in str(caught.value) and "\n" not in str(caught.value)
    assert (caught.value.step, caught.value.item, caught.value.path) == (4, "params", str(path))


def test_a_local_step_whose_placement_names_another_step_is_damaged_and_set_aside(saved):
    _, root = saved
    (step5,) = (root / "local").rglob("5")
    step5.rename(step5.parent / "7")  # a directory renamed by hand, or a copy under another name
    reopened = Checkpoints(
        str(root / "checkpoints"), keep=None, local_directory=str(root / "local"), local_every=1
    )
    assert reopened.latest == 7
    with pytest.raises(CheckpointDamagedError, match=r"local checkpoint step 7 in .* is damaged"):
        reopened.restore(None, 7)
    aside = pathlib.Path(reopened.set_aside_damaged(7))
    assert aside.name.startswith("damaged-7-") and reopened.latest == 4
