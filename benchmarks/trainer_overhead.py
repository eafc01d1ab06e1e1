"""Trainer overhead: steps/s of ``fit`` as the Trainer runs it (sharded jitted step with the
non-finite guard, metrics + tracker, progress, asynchronous checkpoints every N steps) divided by
steps/s of a bare hand-written jitted loop on the same model and data. Goal: >= 0.98.

    python benchmarks/trainer_overhead.py [--steps 100] [--rounds 5] [--checkpoint-every 50]

The model and data are experiments/edm.py's defaults (the ``make train`` run) with evaluation
off. The two loops are timed interleaved (A B A B ...) in one process, after both have compiled,
and the ratio of medians is reported, because the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import optax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dew.config import apply_overrides, load_config  # noqa: E402
from dew.objectives.base import Step  # noqa: E402
from dew.training.loop import fit  # noqa: E402
from dew.training.trainer import Trainer  # noqa: E402


def bare_loop(trainer: Trainer):
    """The hand-written baseline: value_and_grad, the same optimizer, an EMA, nothing else."""
    objective, optimizer, decay = trainer.objective, trainer.optimizer, trainer.config.ema.decay

    @jax.jit
    def init(rng, batch):
        params = objective.init(rng, batch)
        return params, optimizer.init(params), jax.tree.map(jnp.zeros_like, params), rng

    def step(carry, batch):
        params, opt_state, ema, rng = carry
        rng, key = jax.random.split(rng)
        (loss, _), grads = jax.value_and_grad(objective.loss, has_aux=True)(params, key, batch, Step(index=0))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema, params)
        return (params, opt_state, ema, rng), loss

    return init, jax.jit(step, donate_argnums=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="dew-trainer-overhead-")
    config = apply_overrides(
        load_config(os.path.join(ROOT, "experiments", "edm.py")),
        [
            "config.eval.every=0",
            "config.preview.every=0",  # previews have a cadence of their own now
            f"config.checkpoint.every={args.checkpoint_every}",
            f"config.train.num_steps={args.steps * (args.rounds + 1)}",
        ],
    )
    trainer = Trainer(config, workdir)
    data = iter(trainer.train_data)

    # Compile both outside the timing (one step each).
    state = trainer.initial_state()
    state, _ = trainer.step(state, next(data))
    init, step = bare_loop(trainer)
    carry = init(jax.random.PRNGKey(0), next(data))
    carry, _ = step(carry, next(data))
    jax.block_until_ready((state, carry))

    os.makedirs(workdir, exist_ok=True)
    fit_rates, bare_rates = [], []
    for _ in range(args.rounds):
        start = int(state.step)
        tracker = trainer.tracker()
        t0 = time.perf_counter()
        state = fit(state, trainer.step, data, start + args.steps, trainer.stages(tracker))
        jax.block_until_ready(state)
        fit_rates.append(args.steps / (time.perf_counter() - t0))
        tracker.close()

        t0 = time.perf_counter()
        for _ in range(args.steps):
            carry, _ = step(carry, next(data))
        jax.block_until_ready(carry)
        bare_rates.append(args.steps / (time.perf_counter() - t0))
        print(f"round: fit {fit_rates[-1]:.2f} steps/s, bare {bare_rates[-1]:.2f} steps/s", flush=True)

    ratios = [f / b for f, b in zip(fit_rates, bare_rates, strict=True)]
    print(
        f"fit {statistics.median(fit_rates):.3f} steps/s, bare {statistics.median(bare_rates):.3f} steps/s, "
        f"ratio of medians {statistics.median(fit_rates) / statistics.median(bare_rates):.3f}, "
        f"median of per-round ratios {statistics.median(ratios):.3f} "
        f"(devices: {jax.device_count()}, checkpoints saved: {trainer.checkpoints.all_steps()})"
    )


if __name__ == "__main__":
    main()
