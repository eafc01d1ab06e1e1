"""``dew.checkpointing.weights``, the read-only reader of one step's weights that ``dew.pipeline``
(and through it ``dew.sample`` and ``python -m dew.fid``) uses: on the run written by 0a2f708's
code (``data/run_0a2f708``) it gives what ``Checkpoints`` gives, reads only the items it names,
and refuses a step that is not stored or is damaged with one error naming it."""

from __future__ import annotations

import pathlib
import shutil
import sys

import jax
import numpy as np
import pytest

from dew.checkpointing import Checkpoints
from dew.checkpointing.errors import CheckpointDamagedError, CheckpointRestorationError
from dew.checkpointing.weights import read_weights, stored_steps

sys.path.insert(0, str(pathlib.Path(__file__).parent / "data"))
from make_checkpoint_729b5ab import tiny_state

OLD_RUN = pathlib.Path(__file__).parent / "data" / "run_0a2f708"


def copied(tmp_path) -> pathlib.Path:
    shutil.copytree(OLD_RUN, tmp_path / "run")
    return tmp_path / "run" / "checkpoints"


def same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def test_the_old_runs_weights_read_as_checkpoints_restores_them(tmp_path):
    directory = copied(tmp_path)
    c = Checkpoints(str(directory), read_only=True)
    assert stored_steps(directory) == c.all_steps() == [3]
    assert same(read_weights(directory, 3), c.restore_ema(None, 3))  # the same debiasing, bit for bit
    assert same(read_weights(directory, 3, raw=True), c.restore(None, 3)[0].params)
    assert same(read_weights(directory, 3, raw=True), tiny_state(3).params)
    template = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tiny_state(3).params)
    assert same(read_weights(directory, 3, template), c.restore_ema(template, 3))


def test_the_ema_is_read_from_ema_params_and_extra_alone(tmp_path):
    directory = copied(tmp_path)
    expected = read_weights(directory, 3)
    for item in ("params", "opt_state", "data", "dataset"):
        shutil.rmtree(directory / "3" / item)
    assert same(read_weights(directory, 3), expected)
    with pytest.raises(CheckpointDamagedError, match="'params' is missing"):
        read_weights(directory, 3, raw=True)


def test_a_step_not_stored_is_refused_naming_it(tmp_path):
    directory = copied(tmp_path)
    with pytest.raises(CheckpointRestorationError, match=f"no checkpoint for step 4 in {directory}"):
        read_weights(directory, 4)
    assert stored_steps(tmp_path / "nowhere") == []


def test_a_damaged_ema_is_refused_before_its_values_are_used(tmp_path):
    directory = copied(tmp_path)
    data = sorted((directory / "3" / "ema_params" / "ocdbt.process_0" / "d").iterdir())[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointDamagedError, match=r"step 3 .*ema_params"):
        read_weights(directory, 3)
    assert same(read_weights(directory, 3, raw=True), tiny_state(3).params)  # params are intact


def test_a_live_runs_in_flight_save_is_left_alone(tmp_path):
    directory = copied(tmp_path)
    in_flight = directory / "5.orbax-checkpoint-tmp"
    (in_flight / "params").mkdir(parents=True)
    assert stored_steps(directory) == [3]
    assert same(read_weights(directory, 3, raw=True), tiny_state(3).params)
    assert (in_flight / "params").is_dir()  # a reader cleans nothing up
