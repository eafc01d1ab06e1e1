"""How much logging through all four trackers slows a training loop.

A loop of jitted steps (an MLP's forward, backward and SGD update; its statistics fetched to the
host every step, as a logging stage does) runs ``--steps`` steps, either without tracking (A)
or logging ``--scalars`` scalars per step through ``Trackers`` with the local, TensorBoard,
MLflow and W&B (offline) trackers (B): 1000 steps x 10 scalars = 10,000 scalars. A and B
alternate (ABBA ABBA...) for ``--rounds`` rounds on this noisy machine; the slowdown is the median of
the per-round ratios B/A.

Each B round builds fresh trackers in a new directory. The one-time opening of the backends
(importing mlflow/wandb/tensorboard, creating the MLflow database, starting the W&B run) is
done before the clock starts and reported on its own, as is ``close()`` (draining the queues at
the end of the run); a ``--cold`` round also times a loop whose first report opens everything.

    python benchmarks/tracking.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dew.tracking.trackers import LocalTracker, LoggingCategory, Trackers, make_trackers

BACKENDS = ("local", "tensorboard", "mlflow", "wandb")


def make_step(width: int, depth: int, scalars: int):
    def loss_fn(params, x):
        h = x
        for w in params:
            h = jnp.tanh(h @ w)
        return jnp.mean(jnp.square(h - x))

    @jax.jit
    def step(params, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        params = [w - 1e-3 * g for w, g in zip(params, grads, strict=True)]
        norms = [jnp.sqrt(jnp.sum(jnp.square(g))) for g in grads]
        stats = {"loss": loss, "mse_recon": loss, **{f"grad_norm_{i}": n for i, n in enumerate(norms)}}
        while len(stats) < scalars:
            stats[f"stat_{len(stats)}"] = loss * len(stats)
        return params, dict(list(stats.items())[:scalars])

    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(k, (width, width)) / np.sqrt(width) for k in jax.random.split(key, depth)]
    x = jax.random.normal(key, (64, width))
    return step, params, x


def run_loop(step, params, x, steps: int, trackers=None) -> float:
    start = time.perf_counter()
    for i in range(1, steps + 1):
        params, stats = step(params, x)
        values = {k: float(v) for k, v in jax.device_get(stats).items()}
        if trackers is not None:
            trackers.log(LoggingCategory.TRAIN_METRICS, values, i)
    return time.perf_counter() - start


def caller_cost(
    root: str, backends: tuple[str, ...], config: dict, scalars: int, reports: int = 5000
) -> float:
    """Microseconds one ``Trackers.log`` of ``scalars`` values takes on the caller's thread,
    with no step in between (the backends already open)."""
    trackers = make_trackers({"backends": backends}, os.path.join(root, "caller"), config=config)
    trackers.log(LoggingCategory.SYSTEM_METRICS, {"opened": 1.0}, 0)
    trackers.flush()
    values = {f"k{j}": float(j) for j in range(scalars)}
    start = time.perf_counter()
    for i in range(1, reports + 1):
        trackers.log(LoggingCategory.TRAIN_METRICS, values, i)
    elapsed = time.perf_counter() - start
    trackers.close()
    return elapsed / reports * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--scalars", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset")
    parser.add_argument(
        "--control", action="store_true", help="also time local + three writer processes that write nothing"
    )
    parser.add_argument("--cold", action="store_true", help="also time one loop that opens the backends")
    args = parser.parse_args()
    backends = tuple(args.backends.split(","))

    step, params, x = make_step(args.width, args.depth, args.scalars)
    run_loop(step, params, x, 20)  # compile
    root = tempfile.mkdtemp(prefix="dew-tracking-bench-")
    config = {"width": args.width, "depth": args.depth, "steps": args.steps}
    results = {"baseline_s": [], "tracked_s": [], "open_s": [], "close_s": [], "ratio": []}
    if args.control:
        results.update(control_s=[], control_ratio=[])
    for r in range(args.rounds):
        # ABBA: the untracked loop runs first in even rounds and last in odd ones, so neither
        # variant always follows the other (the machine drifts; idle waits change scheduling).
        if r % 2 == 0:
            baseline = run_loop(step, params, x, args.steps)
        trackers = make_trackers({"backends": backends}, os.path.join(root, f"round{r}"), config=config)
        t = time.perf_counter()
        trackers.log(LoggingCategory.SYSTEM_METRICS, {"opened": 1.0}, 0)
        trackers.flush()  # every backend imported and its run open
        opened = time.perf_counter() - t
        tracked = run_loop(step, params, x, args.steps, trackers)
        t = time.perf_counter()
        trackers.close()
        closed = time.perf_counter() - t
        if args.control:  # local + three writer processes that write nothing
            from null_tracker import NullTracker

            nulls = [NullTracker(name) for name in ("tensorboard", "mlflow", "wandb")]
            control_trackers = Trackers([LocalTracker(os.path.join(root, f"control{r}")), *nulls])
            control_trackers.log(LoggingCategory.SYSTEM_METRICS, {"opened": 1.0}, 0)
            control_trackers.flush()
            control = run_loop(step, params, x, args.steps, control_trackers)
            control_trackers.close()
        if r % 2 == 1:
            baseline = run_loop(step, params, x, args.steps)
        row = (baseline, tracked, opened, closed, tracked / baseline)
        for key, value in zip(results, row, strict=False):
            results[key].append(value)
        if args.control:
            results["control_s"].append(control)
            results["control_ratio"].append(tracked / control)
        print(
            f"round {r}: baseline {baseline:.3f}s  tracked {tracked:.3f}s  ratio {tracked / baseline:.4f}  "
            f"(open {opened:.2f}s, close {closed:.2f}s)"
            + (f"  control {control:.3f}s  tracked/control {tracked / control:.4f}" if args.control else ""),
            flush=True,
        )
    summary = {k: statistics.median(v) for k, v in results.items()}
    summary["caller_us_per_report"] = caller_cost(root, backends, config, args.scalars)
    summary["slowdown_pct"] = (summary["ratio"] - 1.0) * 100
    summary["step_ms"] = summary["baseline_s"] / args.steps * 1e3
    summary["per_step_overhead_us"] = (summary["tracked_s"] - summary["baseline_s"]) / args.steps * 1e6
    if args.cold:
        baseline = run_loop(step, params, x, args.steps)
        trackers = make_trackers({"backends": backends}, os.path.join(root, "cold"), config=config)
        cold = run_loop(step, params, x, args.steps, trackers)
        trackers.close()
        summary["cold_ratio"] = cold / baseline
        print(
            f"cold: baseline {baseline:.3f}s  tracked incl. opening {cold:.3f}s  ratio {cold / baseline:.4f}"
        )
    summary.update(
        backends=backends,
        steps=args.steps,
        scalars_per_step=args.scalars,
        rounds=args.rounds,
        cpus=os.cpu_count(),
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
