"""Seconds from launching ``python -m dew.main`` to its first step's log line, on a cold or a
warm machine.

    PYTHONPATH=. python benchmarks/first_step.py [--config=experiments/edm.py]            # cold
    PYTHONPATH=. python benchmarks/first_step.py --machine_cache=/tmp/m   # twice: cold, then warm

Runs the command a user runs, in a fresh temporary workdir, for two steps with evaluation,
previews and checkpoints off, and prints every output line with the seconds since launch. The
machine's caches (kernel decisions and compiled programs, ``DEW_CACHE_DIR``) are a fresh
temporary folder, so the run is cold, unless ``--machine_cache`` names a folder to keep: a
second run with the same folder is a new workdir on a machine that has run dew before.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "experiments" / "edm.py"))
    parser.add_argument("--machine_cache", default="", help="machine cache to keep (default: fresh)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
        env.update(PYTHONPATH=str(ROOT), DEW_CACHE_DIR=args.machine_cache or f"{workdir}/machine")
        command = [
            sys.executable,
            "-m",
            "dew.main",
            f"--config={args.config}",
            f"--workdir={workdir}/run",
            "--config.train.num_steps=2",
            "--config.train.log_every=1",
            "--config.eval.every=0",
            "--config.preview.every=0",
            "--config.checkpoint.every=0",
        ]
        start = time.perf_counter()
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
        )
        for line in process.stdout:
            print(f"{time.perf_counter() - start:7.1f}s  {line.rstrip()}", flush=True)
        process.wait()
    print(f"exit {process.returncode}; load average {os.getloadavg()}")
    return process.returncode


if __name__ == "__main__":
    raise SystemExit(main())
