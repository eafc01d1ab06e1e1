"""The training loop's windowed step statistics: dew's ``DeviceSums`` against ``clu.metrics``.

    python benchmarks/clu_metrics.py [--rounds 7] [--micro-steps 2000] [--steps 100] [config.x=y ...]

``MetricsStage`` averages the step statistics over each ``log_every`` window (flags summed).
dew does it with ``DeviceSums`` (a slot write per step, one jitted fold per 32 steps, one transfer
per window). The ``clu.metrics`` way is a ``Collection`` of ``Average`` metrics merged with each
step's update; two forms are timed:

- **clu, jitted merge**: ``acc = merge(acc, stats)``, one jitted call per step;
- **clu, eager merge**: ``acc = acc.merge(Collection.single_from_model_output(**stats))`` as
  clu's examples write it, un-jitted (a few op dispatches per statistic per step).

Part 1 (host cost): a trivial jitted step that returns the trainer's statistics tree (its names
and dtypes, from one real step), so the time per step is the aggregation's host cost. Part 2
(the loop): ``fit`` with the Trainer's real step (experiments/edm.py's model and data, evaluation,
previews and checkpoints off) and a ``MetricsStage`` using each aggregator. Variants are timed
interleaved in one process (the order reversed every other round), after warm-up, and medians
are reported (the machine is shared).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dew.config import apply_overrides, load_config  # noqa: E402
from dew.tracking.trackers import Trackers  # noqa: E402
from dew.training.loop import fit  # noqa: E402
from dew.training.metrics import DeviceSums  # noqa: E402
from dew.training.stages import COUNTED, MetricsStage  # noqa: E402
from dew.training.trainer import Trainer  # noqa: E402


class CluWindow:
    """``DeviceSums.add`` / ``means`` on a ``clu.metrics.Collection`` of ``Average`` metrics:
    each step's statistics merged into the window's collection (``jitted``: one jitted call per
    step; else clu's eager ``merge``), read once per window."""

    def __init__(self, jitted: bool):
        self.jitted = jitted
        self._acc: Any = None
        self._merge: Any = None

    def add(self, tree: dict[str, jax.Array], stacked: bool = False) -> None:
        if self._merge is None:
            self._names = tuple(tree)
            self._merge = _clu_merge(self._names, self.jitted)
        self._acc = self._merge(self._acc, tree)

    def means(self, counted: frozenset[str] = frozenset()) -> tuple[dict[str, float], int]:
        if self._acc is None:
            return {}, 0
        acc, self._acc = jax.device_get(self._acc), None  # one transfer per window
        averages = {k: getattr(acc, k) for k in self._names}
        count = int(averages[self._names[0]].count)
        means = {k: float(m.total) if k in counted else float(m.total / m.count) for k, m in averages.items()}
        return means, count


@functools.cache
def _clu_merge(names: tuple[str, ...], jitted: bool) -> Any:
    """``merge(acc, stats)``: ``stats`` as a clu update merged into ``acc`` (None: the first);
    one function per set of names, so every window reuses one compiled merge."""
    from clu import metrics

    collection = metrics.Collection.create(**{k: metrics.Average.from_output(k) for k in names})

    def merge(acc, stats):
        update = collection.single_from_model_output(**stats)
        return update if acc is None else acc.merge(update)

    return jax.jit(merge) if jitted else merge


def _aggregators() -> dict[str, Any]:
    return {
        "DeviceSums": DeviceSums,
        "clu, jitted merge": lambda: CluWindow(jitted=True),
        "clu, eager merge": lambda: CluWindow(jitted=False),
    }


def _ordered(variants: dict[str, Any], round_index: int) -> list[tuple[str, Any]]:
    items = list(variants.items())
    return items if round_index % 2 == 0 else items[::-1]


def host_cost(example_stats: dict[str, jax.Array], steps: int, rounds: int, window: int) -> None:
    """Per-step host time of each aggregator on a trivial step (the step alone as baseline)."""

    @jax.jit
    def step(x):
        return x + 1, {k: (x + i).astype(v.dtype) for i, (k, v) in enumerate(example_stats.items())}

    variants = {"step alone": None, **_aggregators()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds + 1):  # round 0 compiles and warms up; the order alternates (ABC CBA)
        for name, make in _ordered(variants, r):
            sums, x = (make() if make else None), jnp.zeros((), jnp.float32)
            t0 = time.perf_counter()
            for i in range(1, steps + 1):
                x, stats = step(x)
                if sums is not None:
                    sums.add(stats)
                    if i % window == 0:
                        sums.means(COUNTED)
            jax.block_until_ready(x)
            if r:
                times[name].append((time.perf_counter() - t0) / steps * 1e6)
    base = statistics.median(times["step alone"])
    print(f"host cost per step ({steps} steps x {rounds} rounds, window {window}; medians):")
    for name, ts in times.items():
        extra = "" if name == "step alone" else f"  (+{statistics.median(ts) - base:.1f} us over the step)"
        per_round = [round(t, 1) for t in ts]
        print(f"  {name:18s} {statistics.median(ts):8.1f} us/step{extra}  rounds: {per_round}")


class _Stage(MetricsStage):
    def __init__(self, aggregator, *args):
        super().__init__(*args)
        self._sums = aggregator


def loop_rates(trainer: Trainer, steps: int, rounds: int) -> None:
    """steps/s of ``fit`` with the real step and a MetricsStage on each aggregator."""
    data = iter(trainer.train_data)
    state = trainer.initial_state()
    state, _ = trainer.step(state, next(data))  # compile
    c = trainer.config
    rates: dict[str, list[float]] = {name: [] for name in _aggregators()}
    for r in range(rounds + 1):  # round 0 warms up every variant; the order alternates (ABC CBA)
        for name, make in _ordered(_aggregators(), r):
            stage = _Stage(make(), Trackers([]), c.train.log_every, c.dataset.batch_size)
            start = int(state.step)
            t0 = time.perf_counter()
            state = fit(state, trainer.step, data, start + steps, [stage])
            jax.block_until_ready(state)
            if r:
                rates[name].append(steps / (time.perf_counter() - t0))
    base = statistics.median(rates["DeviceSums"])
    print(f"fit with the Trainer's step ({steps} steps x {rounds} rounds, log_every {c.train.log_every}):")
    for name, rs in rates.items():
        med = statistics.median(rs)
        print(f"  {name:18s} {med:7.3f} steps/s  ratio {med / base:.4f}  rounds: {[round(x, 3) for x in rs]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--micro-steps", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=100, help="steps per timed round of fit")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. config.model.model_channels=8")
    args = parser.parse_args()
    config = apply_overrides(
        load_config(os.path.join(ROOT, "experiments", "edm.py")),
        ["config.eval.every=0", "config.preview.every=0", "config.checkpoint.every=0", *args.overrides],
    )
    trainer = Trainer(config, tempfile.mkdtemp(prefix="dew-clu-metrics-"))
    state = trainer.initial_state()
    _, example = trainer.step(state, next(iter(trainer.train_data)))
    print("statistics:", {k: str(v.dtype) for k, v in example.items()}, flush=True)
    host_cost(example, args.micro_steps, args.rounds, config.train.log_every)
    loop_rates(trainer, args.steps, args.rounds)


if __name__ == "__main__":
    main()
