"""Through ``python -m dew.main``, with real processes: a run killed with SIGTERM mid-interval
saves the step it was at and resumes bit-identical to a straight run; a second run on a held
workdir exits 2 naming the holder, and after a kill -9 of the holder a restart takes the stale
lock over and resumes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from helpers_common import ROOT

from dew.checkpointing import Checkpoints

TINY = {
    "dataset.batch_size": 16,
    "model.model_channels": 8,
    "model.num_blocks": 1,
    "model.channel_mult": "(1,)",
    "model.attn_resolutions": "()",
    "train.log_every": 1,
    "eval.every": 0,
    "checkpoint.keep_best": False,  # no evaluation: no loss to rank checkpoints by
    "preview.every": 0,
    "optimizer.warmup_steps": 2,
    "mesh.devices": 1,
}


def found(pattern: str, text: str) -> re.Match[str]:
    """The first match of ``pattern`` in ``text``, which the test expects to hold one."""
    match = re.search(pattern, text)
    assert match is not None, (pattern, text)
    return match


def start(workdir, **overrides) -> subprocess.Popen[str]:
    flags = [f"--config.{k}={v}" for k, v in {**TINY, **overrides}.items()]
    command = [
        sys.executable,
        "-m",
        "dew.main",
        "--config=experiments/edm.py",
        f"--workdir={workdir}",
        *flags,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(condition, child: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert child.poll() is None, f"the run ended early: {child.communicate()}"
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def train_steps(workdir) -> list[int]:
    path = workdir / "tracking" / "scalars.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step"] for r in rows if r["category"] == "train"]


def final_leaves(workdir, step: int) -> list[np.ndarray]:
    state, _ = Checkpoints(str(workdir / "checkpoints")).restore(None, step)
    return [np.asarray(x) for x in jax.tree.leaves(state)]


@pytest.mark.slow
def test_sigterm_mid_interval_saves_that_step_and_the_restart_ends_bit_identical(tmp_path):
    steps = {"train.num_steps": 14, "checkpoint.every": 1000}  # no periodic save before the end
    straight = start(tmp_path / "straight", **steps)
    run = start(tmp_path / "run", **steps)
    wait_for(lambda: any(s >= 2 for s in train_steps(tmp_path / "run")), run)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 143, (out, err)
    stopped = int(found(r"preempted by SIGTERM at step (\d+): checkpoint of step \1 saved in", err).group(1))
    assert 2 <= stopped < 14, err
    assert f"resume with: python -m dew.main --config=experiments/edm.py --workdir={tmp_path / 'run'}" in err
    assert Checkpoints(str(tmp_path / "run" / "checkpoints")).all_steps() == [stopped]

    resumed = start(tmp_path / "run", **steps)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert f"resuming from step {stopped}" in out
    assert straight.stderr is not None
    assert straight.wait(timeout=600) == 0, straight.stderr.read()
    a, b = final_leaves(tmp_path / "straight", 14), final_leaves(tmp_path / "run", 14)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):  # params, Adam moments, EMA, rng, step
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_a_second_run_on_a_held_workdir_exits_2_and_a_killed_holders_lock_is_taken_over(tmp_path):
    workdir = tmp_path / "run"
    steps = {"train.num_steps": 60, "checkpoint.every": 2}
    first = start(workdir, **steps)
    wait_for(lambda: (workdir / "checkpoints" / "2").is_dir(), first)

    second = start(workdir, **steps)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 2, (out, err)
    assert f"is in use by a running dew run: pid {first.pid} on host" in err and " since 20" in err
    assert err.count("\n") == 1 and first.poll() is None  # one line; the holder is still training

    first.send_signal(signal.SIGKILL)
    first.wait()
    latest = Checkpoints(str(workdir / "checkpoints")).latest_step()
    assert latest is not None  # step 2 had landed before the kill
    third = start(workdir, **{**steps, "train.num_steps": latest + 2})  # a short finish: lock released
    out, err = third.communicate(timeout=600)
    assert third.returncode == 0, err
    assert f"taking over a stale lock: the run that held it (pid {first.pid} on host" in out
    # The kill can land mid-save: then the newest step is set aside as incomplete (said so) and
    # the run resumes from the one before it, as the crash tests require.
    resumed = int(found(r"resuming from step (\d+)", out).group(1))
    set_aside = f"checkpoint step {latest} is damaged or incomplete" in out
    assert resumed == latest or (set_aside and resumed < latest), out
    assert (workdir / "run.lock").read_text() == ""  # released on a clean exit
