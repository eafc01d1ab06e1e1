"""Running ``python -m dew.main`` on tiny configs, and reading what a run left behind."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time

from helpers_common import ROOT

#: helpers_common.tiny_config's values, so the CLI runs share the tests' compilation cache.
TINY = {
    "dataset.batch_size": 16,
    "model.model_channels": 8,
    "model.num_blocks": 1,
    "model.channel_mult": "(1,)",
    "model.attn_resolutions": "()",
    "train.num_steps": 8,
    "train.log_every": 2,
    "checkpoint.every": 4,
    "eval.every": 4,
    "eval.num_batches": 1,
    "preview.every": 4,
    "objective.sampling.steps": 3,
    "objective.sampling.per_class": 2,
    "optimizer.warmup_steps": 2,
    "mesh.devices": 1,
}
#: The same cadence on the 2D mixture with a one-block residual MLP: for tests of the run's life
#: cycle (restarts, kills, damaged files), where the network is incidental. A launch costs ~5 s
#: here against ~12 s for the tiny U-Net, nearly all of it tracing and lowering the programs.
TINY_MIXTURE = {
    "dataset.batch_size": 16,
    "model.width": 16,
    "model.blocks": 1,
    "train.num_steps": 8,
    "train.log_every": 2,
    "train.steps_per_call": 1,
    "checkpoint.every": 4,
    "checkpoint.keep": 2,
    "eval.every": 4,
    "eval.num_batches": 1,
    "preview.every": 4,
    "objective.sampling.steps": 3,
    "objective.sampling.per_class": 64,  # no classes: 64 points in the scatter plot
    "optimizer.warmup_steps": 2,
    "mesh.devices": 1,
}
EXPERIMENTS = {"edm": ("edm.py", TINY), "mixture": ("mixture2d.py", TINY_MIXTURE)}
# XLA's own C++ log lines (glog format, e.g. "E1201 08:56:13.72 ... slow_operation_alarm") and
# their banners are printed by the compiler under load, not by dew.
_XLA_LOG = re.compile(r"^([EWIF]\d{4} \d\d:\d\d|\*{8,}|\[Compiling module|$)")


def command(workdir, experiment: str = "edm", **overrides) -> list[str]:
    """``python -m dew.main`` on ``experiment`` (a key of ``EXPERIMENTS``) shrunk to its tiny
    values, with ``overrides`` on top."""
    config, tiny = EXPERIMENTS[experiment]
    values = {**tiny, **overrides}
    return [
        sys.executable,
        "-m",
        "dew.main",
        f"--config={ROOT / 'experiments' / config}",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in values.items()),
    ]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def cli(workdir, timeout: float = 900, experiment: str = "edm", **overrides) -> subprocess.CompletedProcess:
    """Run ``python -m dew.main`` on a tiny ``experiment`` with ``overrides`` (``train__num_steps``
    style keys are not needed: pass ``**{"train.num_steps": 12}``)."""
    return subprocess.run(
        command(workdir, experiment, **overrides),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(),
        timeout=timeout,
    )


def dew_stderr(result: subprocess.CompletedProcess) -> list[str]:
    """The stderr lines dew itself printed (XLA's compiler log lines dropped)."""
    return [line for line in result.stderr.splitlines() if not _XLA_LOG.match(line)]


def rows(workdir) -> list[dict]:
    path = os.path.join(workdir, "tracking", "scalars.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f]


def comparable(history: list[dict]) -> list[dict]:
    """Rows with the wall-clock values of system rows blanked (their keys and steps stay)."""
    return [
        {
            k: (None if row["category"] == "system" and k not in ("step", "category") else v)
            for k, v in row.items()
        }
        for row in history
    ]


def snapshot(directory, skip: tuple[str, ...] = ("logs", "cache")) -> dict[str, str]:
    """sha256 of every file under ``directory`` (but ``skip``), by relative path."""
    out = {}
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if os.path.relpath(os.path.join(root, d), directory) not in skip]
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def complete_rows(workdir) -> list[dict]:
    """The history's rows as a live run has written them so far: whole lines only (a row being
    appended right now is left for the next read); none before the file exists."""
    try:
        with open(os.path.join(workdir, "tracking", "scalars.jsonl"), "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split(b"\n")[:-1]]


def wait_for(child: subprocess.Popen, condition, what: str, timeout: float = 600) -> None:
    """Block until ``condition()`` holds, polling what the running ``child`` writes; fail if the
    child exits first or ``timeout`` seconds pass (a hung run, not a slow machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if child.poll() is not None:
            raise AssertionError(f"the run exited ({child.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.005)
