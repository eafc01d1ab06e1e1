"""Post-hoc EMA overhead: step time with two power-EMA profiles (σ_rel 0.05, 0.10) tracked in
the step vs without, on the ``make train`` model (experiments/edm.py: U-Net, batch 64, digits).
Goal: <= 5 % more time per step.

    PYTHONPATH=. python benchmarks/power_ema.py [--steps 20] [--rounds 15]

Both steps are the Trainer's own (same config, one with ``ema.power_std_rels=(0.05, 0.1)``),
compiled before timing, then timed interleaved (A B B A A B ...) in one process on the same
batches with the same threads; the ratio of the medians of per-round step times is reported
(the machine is shared, so single rounds are noisy). Snapshot writing is not included: it is a
host-side stage at a cadence (one params copy per profile every ``snapshot_every`` steps).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dew.config import apply_overrides, load_config  # noqa: E402
from dew.training.trainer import Trainer  # noqa: E402


def build(power: bool) -> tuple[Trainer, object]:
    overrides = ["config.eval.every=0"]
    if power:
        overrides.append("config.ema.power_std_rels=(0.05, 0.1)")
    config = apply_overrides(load_config(os.path.join(ROOT, "experiments", "edm.py")), overrides)
    trainer = Trainer(config, tempfile.mkdtemp(prefix="dew-power-ema-bench-"))
    state = trainer.programs.init(jax.random.PRNGKey(0), trainer.example_batch())
    return trainer, state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    sides = {"plain": build(False), "power": build(True)}
    batches = [
        sides["plain"][0].layout.place_batch(b) for b in itertools.islice(sides["plain"][0].train_data, 4)
    ]
    states = {}
    for name, (trainer, state) in sides.items():  # compile outside the timing
        state, _ = trainer.programs.step(state, batches[0])
        states[name] = jax.block_until_ready(state)
    times: dict[str, list[float]] = {"plain": [], "power": []}
    for r in range(args.rounds):
        order = ("plain", "power") if r % 2 == 0 else ("power", "plain")
        for name in order:
            step, state = sides[name][0]._step, states[name]
            start = time.perf_counter()
            for i in range(args.steps):
                state, stats = step(state, batches[i % len(batches)])
            jax.block_until_ready((state, stats))
            times[name].append((time.perf_counter() - start) / args.steps)
            states[name] = state
    plain, power = statistics.median(times["plain"]), statistics.median(times["power"])
    print(f"threads: XLA CPU default, both sides in one process; rounds {args.rounds} x {args.steps} steps")
    print(f"per-round ms/step plain: {[round(t * 1e3, 1) for t in times['plain']]}")
    print(f"per-round ms/step power: {[round(t * 1e3, 1) for t in times['power']]}")
    print(f"median ms/step: plain {plain * 1e3:.2f}, two power EMAs {power * 1e3:.2f}")
    print(f"overhead: {(power / plain - 1) * 100:+.1f} % (goal <= +5 %)")
    # paired: each round's power time over the adjacent plain time
    ratios = [p / q for p, q in zip(times["power"], times["plain"], strict=True)]
    print(f"median of per-round ratios: {(statistics.median(ratios) - 1) * 100:+.1f} %")


if __name__ == "__main__":
    main()
