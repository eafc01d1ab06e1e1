"""A second Ctrl-C while the preemption save is landing: ``python -m dew.main`` stops at once with
exit status 130 and one message saying which save was cut short and which checkpoint a restart
resumes from; the restart does, and ends bit-identical to a run never interrupted.

To hold the save open while it lands, the run is started through a small launcher that makes
the checkpoint handler's ``finalize`` (items written, the step not yet renamed into place) wait
once a marker file exists: the test creates the marker, sends the first Ctrl-C, waits until the
save is landing, and sends the second. The runs are the tiny 2D mixture's."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from helpers_cli import cli, command, comparable, dew_stderr, env, rows
from helpers_common import ROOT

from dew.checkpointing import Checkpoints
from dew.data.dataset import DataPartition

LONG = {"train.num_steps": 400, "checkpoint.every": 4, "eval.every": 0, "preview.every": 0}

LAUNCHER = """
import os, sys, time
from dew.checkpointing import direct_write, step_files

marker = os.environ["DEW_TEST_HOLD_SAVES"]
finalize = step_files.ChecksummedPyTreeHandler.finalize
checksums = direct_write.write_checksums

def hold(directory):  # an item of <step>.orbax-checkpoint-tmp, written, not yet renamed into place
    if os.path.exists(marker):  # a save that lands slowly (a slow disk): it is in flight now
        with open(marker + ".landing", "w") as f:
            f.write(str(directory))
        time.sleep(600)

def held(self, directory):  # a step orbax writes
    hold(directory)
    return finalize(self, directory)

def held_direct(directory):  # a small step dew writes itself
    hold(directory)
    return checksums(directory)

step_files.ChecksummedPyTreeHandler.finalize = held
direct_write.write_checksums = held_direct
sys.argv = ["dew.main", *sys.argv[1:]]
from dew.main import run
run()
"""


def wait_for(predicate, child, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert child.poll() is None, f"the run ended (rc {child.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def final_state(workdir):
    checkpoints = Checkpoints(str(workdir / "checkpoints"), read_only=True)
    state, position = checkpoints.restore(share=DataPartition())
    import jax

    return [np.asarray(leaf) for leaf in jax.tree.leaves(state)], position


def test_a_second_ctrl_c_during_the_preemption_save_says_what_was_saved_and_exits_130(tmp_path):
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    marker = tmp_path / "hold"
    workdir = tmp_path / "run"
    argv = command(workdir, "mixture", **LONG)
    log = open(tmp_path / "stderr.txt", "w")  # noqa: SIM115  a file: a full pipe would stall the run
    child = subprocess.Popen(
        [sys.executable, str(launcher), *argv[3:]],  # argv[:3] is "python -m dew.main"
        cwd=ROOT,
        env={**env(), "DEW_TEST_HOLD_SAVES": str(marker)},
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        first = workdir / "checkpoints" / "4"
        wait_for(first.exists, child, "checkpoint 4 landed")
        marker.touch()  # every save from now on is held while it lands
        child.send_signal(signal.SIGINT)
        wait_for((tmp_path / "hold.landing").exists, child, "the preemption save began landing")
        started = time.monotonic()
        child.send_signal(signal.SIGINT)
        child.wait(timeout=120)
        stopped_in = time.monotonic() - started
    finally:
        if child.poll() is None:
            child.kill()
        log.close()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stopped_in < 60, stopped_in  # at once, not after the held save's 600 s
    landed = Checkpoints(str(workdir / "checkpoints"), read_only=True).all_steps()
    (line,) = [line for line in dew_stderr_lines(stderr) if line.startswith("dew: interrupted")]
    # The preemption save waits for a periodic save still landing when the first Ctrl-C came;
    # the held one (the one the launcher was finalizing) is then that one, and both are named.
    held = int(Path((tmp_path / "hold.landing").read_text()).parent.name.split(".")[0])
    single = "dew: interrupted by Ctrl-C while the checkpoint of step "
    double = "dew: interrupted by Ctrl-C while the checkpoints of steps "
    if line.startswith(single):
        cut_short = [int(line[len(single) :].split(" ")[0])]
        fate = f"{single}{cut_short[0]} was being saved (it did not land and is discarded at the next start)"
    else:
        assert line.startswith(double), line
        first, _, second = line[len(double) :].split(" ")[:3]
        cut_short = [int(first), int(second)]
        fate = (
            f"{double}{first} and {second} were being saved "
            "(neither landed; both are discarded at the next start)"
        )
    assert held == cut_short[0] and cut_short == sorted(cut_short), (held, cut_short)
    assert not set(cut_short) & set(landed) and cut_short[0] > landed[-1], (cut_short, landed)
    assert line == (
        f"{fate}: the newest saved checkpoint is step {landed[-1]} in "
        f"{workdir / 'checkpoints' / str(landed[-1])}; "
        f"resume from it with: {shlex.join(['python', '-m', 'dew.main', *argv[3:]])}"
    )
    assert list((workdir / "checkpoints").glob(f"{held}.orbax-checkpoint-tmp*"))  # abandoned

    # The restart resumes from the newest landed step, cleans up the abandoned save and ends as
    # a run never interrupted.
    short = {**LONG, "train.num_steps": landed[-1] + 8}
    resumed = cli(workdir, experiment="mixture", **short)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {landed[-1]}" in resumed.stdout
    assert not list((workdir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
    straight = tmp_path / "straight"
    assert cli(straight, experiment="mixture", **short).returncode == 0
    ours, theirs = final_state(workdir), final_state(straight)
    assert ours[1] == theirs[1]
    for a, b in zip(ours[0], theirs[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert comparable(rows(workdir)) == comparable(rows(straight))


def dew_stderr_lines(text: str) -> list[str]:
    return dew_stderr(subprocess.CompletedProcess([], 0, "", text))
