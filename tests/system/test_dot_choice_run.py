"""A transformer's run measures where its dots go, with the real timing children, as a user's
``python -m dew.main`` does: the measurement is said on the run's ``kernel choice:`` line, a new
workdir on the same machine reads the machine's decision instead of measuring again, and XLA's
complaint that it cannot store oneDNN's programs in the compilation cache is not printed per
program (the line says it once when oneDNN wins)."""

from __future__ import annotations

import subprocess
import sys

from helpers_cli import env
from helpers_common import ROOT

from dew.runtime.cpu import dots as dot_choice

TINY_SIT = {
    "dataset.batch_size": 16,
    "model.depth": 1,
    "model.hidden_size": 32,
    "model.num_heads": 2,
    "train.num_steps": 2,
    "train.log_every": 1,
    "checkpoint.every": 2,
    "eval.every": 0,
    "preview.every": 0,
}


def run(workdir, machine) -> subprocess.CompletedProcess:
    environment = {**env(), "DEW_CACHE_DIR": str(machine)}
    environment.pop("DEW_KERNELS_BY_RULE", None)  # the suite's rule: this test measures
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dew.main",
            f"--config={ROOT / 'experiments' / 'sit.py'}:digits",
            f"--workdir={workdir}",
            *(f"--config.{k}={v}" for k, v in TINY_SIT.items()),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
        timeout=900,
    )


def test_a_transformer_run_measures_its_dots_once_per_machine(tmp_path):
    first = run(tmp_path / "a", tmp_path / "machine")
    assert first.returncode == 0, first.stderr[-3000:]
    (line,) = [x for x in first.stdout.splitlines() if x.startswith("dew: kernel choice:")]
    assert "dots measured in" in line and "the step's matrix products xla " in line
    assert ("dots on oneDNN" in line) == (dot_choice.NOT_CACHED in line)
    assert "Error writing persistent compilation cache entry" not in first.stderr
    second = run(tmp_path / "b", tmp_path / "machine")
    assert second.returncode == 0, second.stderr[-3000:]
    (again,) = [x for x in second.stdout.splitlines() if x.startswith("dew: kernel choice:")]
    assert "dots cached for this machine" in again
    assert ("dots on oneDNN" in again) == ("dots on oneDNN" in line)
    assert "Error writing persistent compilation cache entry" not in second.stderr
