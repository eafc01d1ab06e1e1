"""A tiny training run that checkpoints every step, for the SIGKILL crash test.

    python tests/helpers_checkpoint_crash.py WORKDIR NUM_STEPS [FINAL.npz]

Resumes from the latest checkpoint in WORKDIR/checkpoints when there is one (state, rng and data
position), trains to NUM_STEPS with dew's own ``fit`` and ``CheckpointStage`` (asynchronous
saves every step, a donated jitted step), and writes the final state and data position to
FINAL.npz. Prints ``resumed N`` once and ``step N`` after each step has been handed to the
checkpoint stage, so the parent can kill it while a write is in flight.

With ``HOLD_AT=K`` in the environment, the write of step K stops between writing its items into
the temporary directory (orbax's, or ``direct_write``'s for a small state) and renaming it into
place, prints ``mid-write K`` and waits there: a kill then lands mid-write by construction, not
by timing.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew.averaging import ema as ema_lib
from dew.checkpointing import Checkpoints
from dew.data.dataset import Dataset, Source
from dew.training.loop import Stage, StepContext, fit
from dew.training.stages import CheckpointStage
from dew.training.state import TrainState

DECAY = 0.9
OPTIMIZER = optax.adam(0.05)


def source() -> Source:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.3).astype(np.float32)
    return Source("crash-regression", {"x": x, "y": y})


def fresh() -> TrainState:
    params = {"w": jnp.zeros((4,), jnp.float32), "b": jnp.zeros((), jnp.float32)}
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=OPTIMIZER.init(params),
        ema=ema_lib.zeros_like(params),
        rng=jax.random.PRNGKey(7),
    )


def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
    rng, noise_rng = jax.random.split(state.rng)

    def loss(params):
        noise = 0.1 * jax.random.normal(noise_rng, batch["y"].shape)
        return jnp.mean((batch["x"] @ params["w"] + params["b"] + noise - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(state.params)
    updates, opt_state = OPTIMIZER.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        ema=ema_lib.update(state.ema, params, DECAY),
        rng=rng,
    )
    return new, {"loss": value}


class Announce(Stage):
    """Prints each step after the checkpoint stage has handed it to the writer."""

    def observe(self, ctx: StepContext) -> None:
        print(f"step {ctx.step}", flush=True)


def hold_mid_write(step: int) -> None:
    """Stop the write of ``step`` after its items are written, before it is renamed in (by orbax,
    or by ``direct_write``: before its checksums)."""
    from orbax.checkpoint._src.path import atomicity

    finalize = atomicity.AtomicRenameTemporaryPath.finalize

    async def held(self, *args, **kwargs):
        if self._final_path.name == str(step):
            print(f"mid-write {step}", flush=True)
            time.sleep(3600)
        return await finalize(self, *args, **kwargs)

    atomicity.AtomicRenameTemporaryPath.finalize = held

    from dew.checkpointing import direct_write  # a small step dew writes itself

    checksums = direct_write.write_checksums

    def held_direct(item_dir):
        if os.path.basename(os.path.dirname(os.fspath(item_dir))) == f"{step}{direct_write.TMP_SUFFIX}":
            print(f"mid-write {step}", flush=True)
            time.sleep(3600)
        return checksums(item_dir)

    direct_write.write_checksums = held_direct


def main(workdir: str, num_steps: int, final: str | None) -> None:
    if os.environ.get("HOLD_AT"):
        hold_mid_write(int(os.environ["HOLD_AT"]))
    data = Dataset(source(), 8, seed=3)
    checkpoints = Checkpoints(os.path.join(workdir, "checkpoints"), keep=2)
    state, position = checkpoints.resume(fresh(), share=data.share)
    if position is not None:
        data.read_position(position)
    print(f"resumed {int(state.step)}", flush=True)
    stages = [CheckpointStage(checkpoints, data, every=1), Announce()]
    state = fit(state, jax.jit(step, donate_argnums=0), iter(data), num_steps, stages)
    if final:
        leaves = {f"leaf_{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(state))}
        np.savez(final, allow_pickle=True, position=np.frombuffer(data.save_position(), np.uint8), **leaves)
    checkpoints.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
