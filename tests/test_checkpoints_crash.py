"""Crash safety: SIGKILL a training process again and again, resume each time, and end
bit-identical to a run that was never interrupted. Partial checkpoints are never ``latest``."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
from conftest import ROOT

from dew.training.checkpointing import Checkpoints

HELPER = str(ROOT / "tests" / "helpers_checkpoint_crash.py")
NUM_STEPS = 24
KILLS = 10


def start(workdir, final=None) -> subprocess.Popen:
    args = [sys.executable, HELPER, str(workdir), str(NUM_STEPS)] + ([str(final)] if final else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )


def partial_checkpoints(directory) -> list[str]:
    """Step directories orbax had not finished (renamed into place) when the process died."""
    if not os.path.isdir(directory):
        return []
    return [name for name in os.listdir(directory) if "tmp" in name]


def test_sigkill_at_random_moments_then_resume_ends_bit_identical_to_a_straight_run(tmp_path):
    straight = start(tmp_path / "straight", tmp_path / "straight.npz")
    rng = random.Random(1234)
    workdir = tmp_path / "crashed"
    directory = workdir / "checkpoints"
    kills, during_writes, resumed_from = 0, 0, []
    while kills < KILLS:
        child = start(workdir)
        first = child.stdout.readline().split()
        assert first[:1] == ["resumed"], (first, child.stderr.read())
        resumed_from.append(int(first[1]))
        # Kill after a random number of steps, a random moment into the next one; every step
        # hands a save to the writer thread, so most kills land in the middle of a write.
        for _ in range(rng.randint(1, 3)):
            line = child.stdout.readline()
            if not line:
                break
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL, child.stderr.read()
        kills += 1
        during_writes += bool(partial_checkpoints(directory))
        # Whatever was left behind, latest is a complete checkpoint that restores.
        checkpoints = Checkpoints(str(directory), keep=2)
        latest = checkpoints.latest
        if latest is not None:
            state, _ = checkpoints.restore(None, latest)
            assert int(state.step) == latest
        checkpoints.close()

    last = start(workdir, tmp_path / "crashed.npz")
    assert last.wait(timeout=120) == 0, last.stderr.read()
    assert straight.wait(timeout=120) == 0, straight.stderr.read()

    print(f"kills {kills}, during writes {during_writes}, resumed from {resumed_from}")
    assert kills >= 10
    assert during_writes >= 1, "no kill landed while a checkpoint was being written"
    assert len(set(resumed_from)) > 3, resumed_from  # the kills were spread across steps
    a, b = np.load(tmp_path / "straight.npz"), np.load(tmp_path / "crashed.npz")
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:  # params, opt_state, EMA, rng, step and the data position
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
