"""Twenty SIGKILLs of ``python -m dew.main`` at random moments, each followed by a resume: the
final state is bit-identical to a straight run's, and so is the local history (same rows, same
values; only the wall-clock values of system rows differ).

The kills land at random moments that the run itself marks, never after a delay on a clock: some
during start-up (right after launch, once the run holds the workdir's lock, once run.json records
its start), the rest once the history reached a random step (right then, once that step's
checkpoint landed, or once the next save began), so they fall inside steps, tracker writes and
checkpoint writes. A row is
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

import jax
import numpy as np
import pytest
from helpers_cli import comparable, env, rows, wait_for
from helpers_common import ROOT

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
# Kills aimed at a row land at most here, so the run is still training (not saving its last
# checkpoint and exiting) when the kill arrives; later targets kill once the start is recorded.
LAST_TARGET = NUM_STEPS - 9


def command(workdir) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dew.main",
        f"--config={ROOT / 'experiments' / 'mixture2d.py'}",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in MIXTURE.items()),
    ]


def history_lines(workdir) -> int:
    """How many lines the history holds so far (0 before it exists)."""
    try:
        with open(os.path.join(workdir, "tracking", "scalars.jsonl"), "rb") as f:
            return len(f.read().splitlines())
    except FileNotFoundError:
        return 0


def newest_train_step(workdir, skip: int = 0) -> int:
    """The newest train row's step among the history's lines after the first ``skip`` (0 when
    none can be read yet)."""
    try:
        with open(os.path.join(workdir, "tracking", "scalars.jsonl"), "rb") as f:
            lines = f.read().splitlines()[skip:]
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


def lock_holder(workdir) -> int | None:
    """The pid the workdir's lock file names (None while there is none, or it is being written)."""
    try:
        return json.loads((workdir / "run.lock").read_text())["pid"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


def recorded_starts(workdir) -> list:
    """The starts run.json records so far (none while it does not exist or is being replaced)."""
    try:
        return json.loads((workdir / "run.json").read_text())["starts"]
    except (FileNotFoundError, ValueError, KeyError):
        return []


def checkpoint_names(workdir) -> list[str]:
    directory = workdir / "checkpoints"
    return os.listdir(directory) if directory.is_dir() else []


def landed_from(workdir, step: int) -> bool:
    """Whether a checkpoint of ``step`` or later has landed (renamed into place)."""
    return any(name.isdigit() and int(name) >= step for name in checkpoint_names(workdir))


def save_begun_from(workdir, step: int) -> bool:
    """Whether the save of ``step`` or a later one has begun: its temporary directory
    (``<step>.<suffix>``) or the landed one exists."""
    leading = (name.split(".")[0] for name in checkpoint_names(workdir))
    return any(first.isdigit() and int(first) >= step for first in leading)


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
    targets = sorted(rng.randint(3, LAST_TARGET) for _ in range(KILLS))
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
        assert child.stderr is not None  # piped
        if i in at_startup:
            # A moment of the start-up the run itself marks: right after launch (the interpreter
            # starting), once it holds the workdir's lock, or once run.json records its start.
            moment = rng.choice(["launched", "locked", "start recorded"])
            if moment == "locked":
                pid = child.pid
                wait_for(child, lambda pid=pid: lock_holder(workdir) == pid, "the workdir lock")
            elif moment == "start recorded":
                n = len(recorded_starts(workdir))
                wait_for(child, lambda n=n: len(recorded_starts(workdir)) > n, "a new start in run.json")
        else:
            # Once this run's part of the history reached the target step t (a train row, written
            # with checkpoint t): right then, once checkpoint t has landed, or once the save of
            # t + 3 is under way. Rows an earlier, killed run wrote past its last checkpoint are
            # still in the file, so only rows appended after this run recorded its start count,
            # and the target is never before the step it resumed from.
            n = len(recorded_starts(workdir))
            wait_for(child, lambda n=n: len(recorded_starts(workdir)) > n, "a new start in run.json")
            resumed_from = recorded_starts(workdir)[-1]["resumed_from"]
            seen = history_lines(workdir)
            target = max(targets[i], resumed_from + 3)
            if target <= LAST_TARGET:
                reached = lambda seen=seen, target=target: newest_train_step(workdir, seen) >= target  # noqa: E731
                wait_for(child, reached, f"a train row at {target}")
                t = newest_train_step(workdir, seen)
                moment = rng.choice(["row written", "checkpoint landed", "next save begun"])
                if moment == "checkpoint landed":
                    wait_for(child, lambda t=t: landed_from(workdir, t), f"checkpoint {t}")
                elif moment == "next save begun" and t + 3 < NUM_STEPS:
                    wait_for(child, lambda t=t: save_begun_from(workdir, t + 3), f"the save of step {t + 3}")
        assert child.poll() is None, (
            f"kill {i}: the run ended before it ({child.returncode}): {child.stderr.read()}"
        )
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()
        kills += child.returncode == -signal.SIGKILL
        if i in tear_after and (workdir / "tracking" / "scalars.jsonl").exists():
            with open(workdir / "tracking" / "scalars.jsonl", "a") as f:
                f.write(torn_row(rng, newest_train_step(workdir) + 3))
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
