"""How long the training loop blocks per asynchronous checkpoint save, relative to a
synchronous save of the same state (goal: <= 0.05).

    python benchmarks/checkpoint.py [--rounds 7] [--megabytes 50]

The state is a TrainState of about ``--megabytes`` MB (params, two Adam moments and the EMA,
float32, random so compression cannot shrink the write). Each round times, side by side:

* async: ``Checkpoints.save`` returning (what the loop waits for); the write then finishes on
  the writer thread, and ``wait`` is called outside the timed region, as a loop would go on
  training meanwhile;
* sync: ``Checkpoints(asynchronous=False).save``, which returns once the step has landed.

The two alternate (ABAB...) so machine noise hits both; the medians are reported.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import optax

from dew.checkpointing import Checkpoints
from dew.training.state import TrainState


def make_state(megabytes: float) -> TrainState:
    """Params of ``megabytes / 4`` MB in eight leaves; Adam's two moments and the EMA match."""
    per_leaf = int(megabytes / 4 * 2**20 / 4 / 8)
    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    params = {f"layer{i}": jax.random.normal(k, (per_leaf // 256, 256)) for i, k in enumerate(keys)}
    opt_state = optax.adam(1e-3).init(params)
    opt_state = jax.tree.map(lambda x: x + jax.random.normal(keys[0], x.shape) if x.ndim else x, opt_state)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=opt_state,
        ema=jax.tree.map(lambda x: 0.5 * x, params),
        rng=jax.random.PRNGKey(1),
    )
    return jax.block_until_ready(state)


def nbytes(state: TrainState) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(state))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--megabytes", type=float, default=50.0)
    parser.add_argument("--directory", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="dew-ckpt-bench-", dir=args.directory)
    try:
        state = make_state(args.megabytes)
        print(f"state: {nbytes(state) / 2**20:.1f} MiB in {len(jax.tree.leaves(state))} arrays")
        variants = {
            "async": Checkpoints(os.path.join(root, "async"), keep=2),
            "sync": Checkpoints(os.path.join(root, "sync"), keep=2, asynchronous=False),
        }
        blocked: dict[str, list[float]] = {name: [] for name in variants}
        for round_index in range(args.rounds + 1):  # round 0 warms up (manager creation, compiles)
            step = round_index + 1
            state = jax.block_until_ready(state.replace(step=jnp.asarray(step, jnp.int32)))
            for name, checkpoints in variants.items():
                start = time.perf_counter()
                checkpoints.save(step, state, None)
                elapsed = time.perf_counter() - start
                checkpoints.wait()  # outside the timed region: the loop would be training here
                if round_index:
                    blocked[name].append(elapsed)
        for checkpoints in variants.values():
            checkpoints.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    medians = {name: statistics.median(times) for name, times in blocked.items()}
    for name, times in blocked.items():
        rounds = [round(t * 1e3, 2) for t in times]
        print(f"{name:5s} blocked median {medians[name] * 1e3:8.2f} ms  (rounds, ms: {rounds})")
    print(f"ratio async/sync = {medians['async'] / medians['sync']:.4f}  (goal <= 0.05)")


if __name__ == "__main__":
    main()
