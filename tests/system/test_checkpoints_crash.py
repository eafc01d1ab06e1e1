"""Crash safety: SIGKILL a training process again and again, resume each time, and end
bit-identical to a run that was never interrupted. Partial checkpoints are never ``latest``.
Half of the kills land mid-write by construction (the child holds a write and says so), so the
test does not depend on timing to exercise that case; the other kills follow what the run prints
and writes, never a clock."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
from helpers_cli import wait_for
from helpers_common import ROOT

from dew.checkpointing import Checkpoints

HELPER = str(ROOT / "tests" / "helpers_checkpoint_crash.py")
NUM_STEPS = 40  # enough that ten kills of at most a few steps each never reach the end
KILLS = 10


def start(workdir, final=None, hold_at=None) -> subprocess.Popen[str]:
    args = [sys.executable, HELPER, str(workdir), str(NUM_STEPS)] + ([str(final)] if final else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if hold_at is not None:
        env["HOLD_AT"] = str(hold_at)
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
    resumed_from, mid_write_kills, latest = [], 0, None
    for kill in range(KILLS):
        # Even kills land mid-write by construction: the child holds the write of a step two or
        # three ahead between writing its items and renaming them into place, and says so.
        # Odd kills land after 2-4 steps, as step k's save is handed over or once it has landed
        # (synchronised on what the run prints and writes, not on time). Either way at
        # least one step lands first ("step k" is printed once save k was handed over, which
        # waits for step k-1 to land), so every resume starts later than the one before.
        mid_write = kill % 2 == 0
        hold_at = (latest or 0) + rng.randint(2, 3) if mid_write else None
        child = start(workdir, hold_at=hold_at)
        assert child.stdout is not None and child.stderr is not None  # both piped
        first = child.stdout.readline().split()
        assert first[:1] == ["resumed"], (first, child.stderr.read())
        resumed_from.append(int(first[1]))
        if mid_write:
            for line in child.stdout:
                if line.startswith("mid-write"):
                    break
            else:
                pytest.fail(f"the write of step {hold_at} was never held: {child.stderr.read()}")
        else:
            line = ""
            for _ in range(rng.randint(2, 4)):
                line = child.stdout.readline()
                assert line.startswith("step "), (line, child.stderr.read())
            # At a moment the run itself marks: just after step k was handed to the writer (its
            # save in flight, often mid-write), or once that save has landed (the next step running).
            landed = directory / line.split()[1]
            if rng.random() < 0.5:
                wait_for(child, landed.is_dir, f"checkpoint {landed.name} landing")
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL, child.stderr.read()
        if mid_write:
            assert partial_checkpoints(directory), f"kill {kill}: no partial checkpoint of step {hold_at}"
            mid_write_kills += 1
        # Whatever was left behind, latest is a complete checkpoint that restores.
        checkpoints = Checkpoints(str(directory), keep=2)
        latest = checkpoints.latest_step()
        if mid_write:
            assert hold_at is not None
            assert latest is None or latest < hold_at  # the held step never became latest
        if latest is not None:
            state, _ = checkpoints.restore(None, latest)
            assert int(state.step) == latest
        checkpoints.close()

    last = start(workdir, tmp_path / "crashed.npz")
    assert last.stderr is not None and straight.stderr is not None
    assert last.wait(timeout=120) == 0, last.stderr.read()
    assert straight.wait(timeout=120) == 0, straight.stderr.read()

    print(f"resumed from {resumed_from}")
    assert len(resumed_from) == KILLS and mid_write_kills == KILLS // 2
    assert all(b > a for a, b in itertools.pairwise(resumed_from)), resumed_from  # spread over steps
    a, b = np.load(tmp_path / "straight.npz"), np.load(tmp_path / "crashed.npz")
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:  # params, opt_state, EMA, rng, step and the data position
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
