"""A full disk during an asynchronous save: the error surfaces, the run stops, and every older
checkpoint is still intact and restorable. The disk is a real size-limited tmpfs where one can be
mounted; everywhere, the same failure is also injected into the write (ENOSPC raised after a
step's items were written, before it is renamed into place: by orbax, or by ``direct_write`` for
a small state), so CI always runs the behaviour."""

from __future__ import annotations

import errno
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.checkpointing import Checkpoints, CheckpointWriteError
from dew.data.dataset import Dataset, Source
from dew.training.loop import Stage, StepContext, fit
from dew.training.stages import CheckpointStage
from dew.training.state import TrainState

OPTIMIZER = optax.adam(1e-3)


def first_state() -> TrainState:
    """~1 MB per checkpoint of incompressible values (params, two Adam moments, EMA)."""
    params = {"w": jax.random.normal(jax.random.PRNGKey(0), (256, 256))}
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=OPTIMIZER.init(params),
        ema=jax.tree.map(jnp.zeros_like, params),
        rng=jax.random.PRNGKey(1),
    )


def step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    rng, noise = jax.random.split(state.rng)
    params = {"w": state.params["w"] + jax.random.normal(noise, (256, 256))}
    opt_state = jax.tree.map(lambda x: x + 1 if x.ndim else x, state.opt_state)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema=params, rng=rng), {}


class Seen(Stage):
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.states: dict[int, TrainState] = {}

    def observe(self, ctx: StepContext) -> None:
        self.steps.append(ctx.step)
        self.states[ctx.step] = jax.device_get(ctx.state)


FULL_AT = 4  # the injected disk fills up during the write of this step


@pytest.fixture(params=["tmpfs", "injected"])
def small_disk(tmp_path, request, monkeypatch):
    mount = tmp_path / "disk"
    mount.mkdir()
    if request.param == "injected":
        from orbax.checkpoint._src.path import atomicity

        finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def full(self, *args, **kwargs):
            name = self._final_path.name  # the step directory (items finalize under it too)
            if name.isdigit() and int(name) >= FULL_AT:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.get()))
            return await finalize(self, *args, **kwargs)

        monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", full)
        from dew.checkpointing import direct_write  # a small step dew writes itself

        checksums = direct_write.write_checksums

        def full_direct(item_dir):
            step = os.path.basename(os.path.dirname(os.fspath(item_dir))).split(".")[0]
            if int(step) >= FULL_AT:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(item_dir))
            return checksums(item_dir)

        monkeypatch.setattr(direct_write, "write_checksums", full_direct)
        yield mount
        return
    command = ["mount", "-t", "tmpfs", "-o", "size=1600k", "tmpfs", str(mount)]
    result = subprocess.run(command, capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {result.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_the_run_and_leaves_older_checkpoints_restorable(small_disk):
    checkpoints = Checkpoints(str(small_disk / "checkpoints"), keep=2)
    data = Dataset(Source("zeros", {"x": np.zeros((8, 1), np.float32)}), 1)
    seen = Seen()
    with pytest.raises(CheckpointWriteError, match=r"checkpoint step \d did not land .*No space left"):
        fit(first_state(), jax.jit(step), iter(data), 8, [seen, CheckpointStage(checkpoints, data, every=1)])
    assert max(seen.steps) < 8  # the run stopped at the save after the one that failed

    reopened = Checkpoints(str(small_disk / "checkpoints"), keep=2)
    stored = reopened.all_steps()
    assert stored and max(stored) < max(seen.steps)
    template = jax.eval_shape(first_state)
    for saved in stored:  # every checkpoint that landed is whole and bit-identical
        state, _ = reopened.restore(template, saved)
        for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(seen.states[saved]), strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
