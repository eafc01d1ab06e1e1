"""Twenty SIGKILLs of ``python -m dew.main`` at random moments, each followed by a resume: the
final state is bit-identical to a straight run's, and so is the local history (same rows, same
values; only the wall-clock values of system rows differ).

The kills land at random moments: some during start-up (a random delay after launch, cut short
where the run already wrote a new train row), the rest a random delay after the history reached a
random step, so they fall inside steps, evaluation, tracker writes and checkpoint writes. A row is
appended with one ``write``, which a kill cannot split; what a power loss or a full disk leaves
instead (a torn last row) is reproduced after some kills by appending part of a row, as the file
would hold had the kill landed mid-write.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import ROOT
from helpers_cli import comparable, env, rows

from dew.checkpointing import Checkpoints
from dew.data.dataset import DataPartition

KILLS = 20
NUM_STEPS = 60
# A residual MLP on the 2D mixture: the smallest model dew trains, so each resume is mostly
# process start-up. Windows and checkpoints every 3 steps, so every resume starts a whole window.
MIXTURE = {
    "model.width": 16,
    "model.blocks": 1,
    "dataset.batch_size": 32,
    "train.num_steps": NUM_STEPS,
    "train.log_every": 3,
    "checkpoint.every": 3,
    "optimizer.warmup_steps": 5,
    "eval.every": 0,
    "preview.every": 0,
    "mesh.devices": 1,
}


def command(workdir) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dew.main",
        f"--config={ROOT / 'experiments' / 'mixture2d.py'}",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in MIXTURE.items()),
    ]


def last_train_step(workdir) -> int:
    """The newest train row's step in the history (0 when none can be read yet)."""
    try:
        with open(os.path.join(workdir, "tracking", "scalars.jsonl"), "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("category") == "train":
            steps.append(row["step"])
    return max(steps)


def torn_row(rng: random.Random, step: int) -> str:
    row = json.dumps({"step": step, "category": "train", "loss": 0.123456789, "grad_norm": 1.5})
    return row[: rng.randint(1, len(row) - 1)]


@pytest.mark.slow
def test_twenty_kills_at_random_moments_then_resumes_end_bit_identical_to_a_straight_run(tmp_path):
    # The uninterrupted run trains alongside the killed ones (its own workdir); checked at the end.
    # Its stderr goes to a file (a full pipe would stall it); the child keeps its own descriptor.
    with open(tmp_path / "straight.stderr", "w") as straight_log:
        straight = subprocess.Popen(
            command(tmp_path / "straight"),
            cwd=ROOT,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=straight_log,
        )
    rng = random.Random(14)
    targets = sorted(rng.randint(3, NUM_STEPS - 9) for _ in range(KILLS))
    at_startup = set(rng.sample(range(KILLS), 4))
    tear_after = set(rng.sample(range(KILLS), 4))
    workdir = tmp_path / "killed"
    kills = 0
    for i in range(KILLS):
        child = subprocess.Popen(
            command(workdir),
            cwd=ROOT,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if i in at_startup:
            # A random moment within the start-up: at most 4 s, and before the run's first new
            # train row (a fast CPU starts and trains the remaining steps within 4 s).
            before, deadline = last_train_step(workdir), time.monotonic() + rng.uniform(0.0, 4.0)
            while child.poll() is None and time.monotonic() < deadline and last_train_step(workdir) <= before:
                time.sleep(0.01)
        else:
            while child.poll() is None and last_train_step(workdir) < targets[i]:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.1))
        assert child.poll() is None, (
            f"kill {i}: the run ended before it ({child.returncode}): {child.stderr.read()}"
        )
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()
        kills += child.returncode == -signal.SIGKILL
        if i in tear_after and (workdir / "tracking" / "scalars.jsonl").exists():
            with open(workdir / "tracking" / "scalars.jsonl", "a") as f:
                f.write(torn_row(rng, last_train_step(workdir) + 3))
    assert kills == KILLS

    final = subprocess.run(command(workdir), capture_output=True, text=True, cwd=ROOT, env=env())
    assert final.returncode == 0, final.stderr
    assert straight.wait(timeout=600) == 0, (tmp_path / "straight.stderr").read_text()
    a, pos_a = Checkpoints(str(tmp_path / "straight" / "checkpoints")).restore(share=DataPartition())
    b, pos_b = Checkpoints(str(workdir / "checkpoints")).restore(share=DataPartition())
    assert int(a.step) == int(b.step) == NUM_STEPS
    flat_a, flat_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(flat_a) == len(flat_b)
    for x, y in zip(flat_a, flat_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bit-identical, not close
    assert pos_a == pos_b
    assert comparable(rows(workdir)) == comparable(rows(tmp_path / "straight"))
    starts = json.loads((workdir / "run.json").read_text())["starts"]
    assert all(s["resumed_from"] % 3 == 0 for s in starts)  # only ever from a checkpoint
