"""Reading a run while it trains leaves it alone: ``dew.pipeline`` (what ``dew.sample`` and
``dew.fid --workdir`` load) and ``Checkpoints`` opened on the live run's directory, each opened
while one of the run's saves is in flight (its ``<step>.orbax-checkpoint-tmp`` on disk), and the
run ends bit-identical to one nobody read. Each reader reads a step that has landed whole.

The runs are the tiny 2D mixture's (``helpers_cli.TINY_MIXTURE``), saving every other step."""

from __future__ import annotations

import subprocess
import time

import numpy as np
from helpers_cli import cli, command, comparable, env, rows
from helpers_common import ROOT

import dew
from dew.checkpointing import Checkpoints
from dew.data.dataset import DataPartition
from dew.inference import PipelineError

#: A save every other step, none pruned while the readers read (``keep``), 24 steps.
OFTEN = {"train.num_steps": 24, "checkpoint.every": 2, "checkpoint.keep": 100, "preview.every": 8}
IN_FLIGHT = "*.orbax-checkpoint-tmp*"


def final_state(workdir):
    checkpoints = Checkpoints(str(workdir / "checkpoints"), read_only=True)
    state, position = checkpoints.restore(share=DataPartition())
    return [np.asarray(leaf) for leaf in jax_leaves(state)], position, checkpoints.all_steps()


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def read_once(workdir, turn: int) -> int | None:
    """One reader, by turn: the pipeline, a ``Checkpoints`` as any script opens one (default
    options), a read-only ``Checkpoints`` restoring the latest step. Returns the step read."""
    directory = str(workdir / "checkpoints")
    if turn % 3 == 0:
        try:
            return dew.pipeline(str(workdir)).step
        except PipelineError as e:  # the run has not saved yet: nothing to load
            assert "has no checkpoint yet" in str(e) or "is not a dew run" in str(e), e
            return None
    checkpoints = Checkpoints(directory, read_only=turn % 3 == 2)
    try:
        step = checkpoints.latest_step()
        if step is not None and turn % 3 == 2:
            state, _ = checkpoints.restore(step=step)
            assert int(state.step) == step
        return step
    finally:
        checkpoints.close()


def test_readers_opened_during_the_saves_of_a_live_run_leave_it_bit_identical(tmp_path):
    straight = tmp_path / "straight"
    result = cli(straight, experiment="mixture", **OFTEN)
    assert result.returncode == 0, result.stderr

    workdir = tmp_path / "read"
    log = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115  a file: a full pipe would stall the run
    child = subprocess.Popen(
        command(workdir, "mixture", **OFTEN), cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=log
    )
    during_a_save, read = 0, []
    try:
        while child.poll() is None:
            # Synchronised on what the run writes: a reader opens the moment a save is in flight.
            if not list((workdir / "checkpoints").glob(IN_FLIGHT)):
                time.sleep(0.001)
                continue
            during_a_save += 1
            step = read_once(workdir, during_a_save)
            if step is not None:
                read.append(step)
        child.wait(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
        log.close()
    assert child.returncode == 0, (tmp_path / "stderr.txt").read_text()
    assert during_a_save >= 3, f"only {during_a_save} reads overlapped a save: the test proved nothing"
    ours, theirs = final_state(workdir), final_state(straight)
    assert set(read) <= set(ours[2]), (read, ours[2])  # every step read was one that landed whole
    assert ours[1] == theirs[1] and ours[2] == theirs[2]
    for a, b in zip(ours[0], theirs[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert comparable(rows(workdir)) == comparable(rows(straight))
