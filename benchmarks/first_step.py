"""Seconds from launching ``python -m dew.main`` to its first step's log line, cold cache.

    PYTHONPATH=. python benchmarks/first_step.py [--config=experiments/edm.py]

Runs the command a user runs in a fresh temporary workdir (its ``cache/jax`` empty,
``JAX_COMPILATION_CACHE_DIR`` empty) for two steps with evaluation, previews and checkpoints
off, and prints every output line with the seconds since launch.
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
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_COMPILATION_CACHE_DIR": ""}
    with tempfile.TemporaryDirectory() as workdir:
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
