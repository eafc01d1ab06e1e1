"""How glibc's malloc serves a CPU train step's memory: one step's time, faults and kernel time per mode.

    PYTHONPATH=. python benchmarks/step_memory.py [--rounds=3] [--steps=60] [--modes=...] \\
        [config.<key>=<value> ...]

XLA:CPU allocates each execution's temporary buffer as one block with ``malloc`` and frees it
when the execution ends (``dew.runtime.cpu.memory``). Each mode runs the digits race's train step
(``experiments/edm.py`` at batch 128, one CPU device per core, as ``python -m dew.main`` runs it;
overrides as positional ``config.<key>=<value>``) in a fresh process started with its own
``GLIBC_TUNABLES``:

- ``defaults``: glibc's defaults (every step maps its block anew, in 4 KiB pages);
- ``huge_pages``: ``glibc.malloc.hugetlb=1`` (mapped anew each step, in 2 MiB pages: what
  ``python -m dew.main`` restarted with before the kept heap);
- ``kept_heap``: ``dew.runtime.cpu.memory.TUNABLES`` (one arena, no mappings for large blocks,
  trim beyond 1 GiB: what ``python -m dew.main`` restarts with);
- ``both``: the two together;
- ``mallopt``: no tunables, the kept heap's settings made with ``mallopt`` in the running process
  by ``dew.runtime.start`` (``config.runtime.reuse_freed_memory``: a user's script).

Every mode but ``mallopt`` runs with ``config.runtime.reuse_freed_memory=False``, so what it
measures is its tunables alone. Rounds alternate the modes; in each process ``--warmup`` steps
run untimed, then ``--steps`` steps are timed with ``getrusage`` around them (each step
dispatched before the previous one is waited for, as ``fit`` runs them). The report: per mode the
seconds a step in each round, their median, and the minor faults and kernel seconds a step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from dew.runtime.cpu.memory import TUNABLES

KEPT = ":".join(f"{name}={value}" for name, value in TUNABLES.items())
MODES = {
    "defaults": "",
    "huge_pages": "glibc.malloc.hugetlb=1",
    "kept_heap": KEPT,
    "both": f"glibc.malloc.hugetlb=1:{KEPT}",
    "mallopt": "",
}


def worker(steps: int, warmup: int, overrides: list[str]) -> dict:
    """Time ``steps`` train steps of the race's network in this process (after ``warmup``)."""
    import jax

    from dew.config import load_config
    from dew.runtime.platform import start
    from dew.training.trainer import Trainer, resolve_config

    here = os.path.dirname(os.path.abspath(__file__))
    config = resolve_config(
        load_config(os.path.join(here, "..", "experiments", "edm.py")),
        ["config.dataset.batch_size=128", "config.eval.num_batches=1", *overrides],
    )
    start(config)
    trainer = Trainer(config, os.path.join("/tmp", f"dew-step-memory-{os.getpid()}"), resolved=True)
    state = trainer.programs.init(jax.random.PRNGKey(config.seed), trainer.example_batch())
    batches = iter(trainer.train_data)
    state, stats = trainer.step(state, next(batches))
    for _ in range(warmup):
        state, stats = trainer.step(state, next(batches))
    jax.block_until_ready(stats["loss"])
    before, clock = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps):
        state, stats = trainer.step(state, next(batches))
    jax.block_until_ready(stats["loss"])
    after, seconds = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - clock
    return {
        "step_s": seconds / steps,
        "minor_faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
        "kernel_s_per_step": (after.ru_stime - before.ru_stime) / steps,
        "user_s_per_step": (after.ru_utime - before.ru_utime) / steps,
        "max_rss_mb": after.ru_maxrss / 1024,
        "devices": trainer.layout.data_parallel_size,
    }


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    """One fresh process of ``mode`` (its ``GLIBC_TUNABLES``), its ``worker`` result."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update({"GLIBC_TUNABLES": MODES[mode]} if MODES[mode] else {})
    reuse = "True" if mode == "mallopt" else "False"
    cmd = [sys.executable, __file__, "--worker", f"--steps={args.steps}", f"--warmup={args.warmup}"]
    cmd += [*args.overrides, f"config.runtime.reuse_freed_memory={reuse}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"step_memory: mode {mode} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="steps timed in each process")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument(
        "--modes", default="huge_pages,kept_heap", help=f"comma-separated, of {sorted(MODES)}"
    )
    parser.add_argument("--out", default="", help="also write the results as JSON here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config.<key>=<value>")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.steps, args.warmup, args.overrides)))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; known: {sorted(MODES)}")
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    for round_ in range(1, args.rounds + 1):
        for mode in modes:
            result = run_mode(mode, args)
            results[mode].append(result)
            print(
                f"round {round_} {mode:10s} {result['step_s'] * 1e3:7.1f} ms a step, "
                f"{result['minor_faults_per_step']:8.0f} faults, {result['kernel_s_per_step'] * 1e3:6.1f} ms "
                f"kernel, peak RSS {result['max_rss_mb']:.0f} MB (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    for mode, runs in results.items():
        steps = [r["step_s"] * 1e3 for r in runs]
        print(
            f"{mode:10s} median {statistics.median(steps):7.1f} ms a step "
            f"({', '.join(f'{s:.1f}' for s in steps)}); "
            f"faults {statistics.median(r['minor_faults_per_step'] for r in runs):.0f}, "
            f"kernel {statistics.median(r['kernel_s_per_step'] for r in runs) * 1e3:.1f} ms a step"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"modes": results, "steps": args.steps, "overrides": args.overrides}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
