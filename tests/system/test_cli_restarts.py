"""Every restart through ``python -m dew.main`` succeeds or says why in one short message, and
the records read as one run: torn tracker rows, a run killed before its first checkpoint,
starting over, changed configs, the skip policy's brake, a checkpoint whose data item is gone.

One straight 8-step run and one straight 12-step run are made once per module; each test works
on a copy and checks the message and that nothing good was lost. The runs are the 2D mixture's
(``helpers_cli.TINY_MIXTURE``): the same Trainer, checkpoints and history as the image runs at a
third of the launch time; ``test_training`` resumes the README's image experiment itself."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess

import numpy as np
import pytest
from helpers_cli import cli as cli_on
from helpers_cli import command, comparable, complete_rows, dew_stderr, env, rows, snapshot, wait_for
from helpers_common import ROOT

from dew.checkpointing import Checkpoints
from dew.data.dataset import DataPartition


def cli(workdir, **overrides) -> subprocess.CompletedProcess:
    """``helpers_cli.cli`` on the tiny 2-D mixture run, with dotted config ``overrides``."""
    return cli_on(workdir, experiment="mixture", **overrides)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Two untouched runs of the tiny mixture config: to step 8, and to step 12."""
    base = tmp_path_factory.mktemp("straight")
    for steps in (8, 12):
        result = cli(base / str(steps), **{"train.num_steps": steps})
        assert result.returncode == 0, result.stderr
    return base


def copy_of(straight, tmp_path, steps=8):
    target = tmp_path / "run"
    shutil.copytree(straight / str(steps), target, ignore=shutil.ignore_patterns("logs"))
    return target


def assert_short_failure(result, code):
    """The CLI's failure contract: the exit status, one ``error:`` line first, at most three dew
    lines in all, and no traceback on the console."""
    lines = dew_stderr(result)
    assert result.returncode == code, result.stderr
    assert lines and lines[0].startswith("error: "), lines
    assert len(lines) <= 3, lines
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    return lines


def test_a_row_torn_by_a_kill_is_trimmed_and_the_resumed_history_matches_a_straight_run(straight, tmp_path):
    workdir = copy_of(straight, tmp_path)
    with open(workdir / "tracking" / "scalars.jsonl", "a") as f:
        f.write('{"step": 10, "category": "train", "grad_no')  # a kill in the middle of row 10
    result = cli(workdir, **{"train.num_steps": 12})
    assert result.returncode == 0, result.stderr
    assert "trimmed a torn last row" in result.stderr
    assert comparable(rows(workdir)) == comparable(rows(straight / "12"))
    starts = json.loads((workdir / "run.json").read_text())["starts"]
    assert [s["resumed_from"] for s in starts] == [0, 8]
    assert [s["config"]["train"]["num_steps"] for s in starts] == [8, 12]
    assert all(s["dew_version"] and s["time"] for s in starts)


def test_a_run_killed_before_its_first_checkpoint_leaves_no_duplicate_rows(straight, tmp_path):
    # The killed run's first checkpoint is far beyond its kill: it is killed once its history holds
    # rows up to step 6 (train 2, 4, 6, evaluation 4), which the restart (checkpoints every 4) must
    # not duplicate. No moment of the kill can land after a checkpoint.
    workdir = tmp_path / "run"
    child = subprocess.Popen(
        command(workdir, "mixture", **{"train.num_steps": 100_000, "checkpoint.every": 100_000}),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(child, lambda: any(r["step"] >= 6 for r in complete_rows(workdir)), "a row at step 6")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert not Checkpoints(str(workdir / "checkpoints")).all_steps()
    assert {r["step"] for r in rows(workdir) if r["category"] == "train"} >= {2, 4, 6}
    result = cli(workdir)
    assert result.returncode == 0, result.stderr
    assert comparable(rows(workdir)) == comparable(rows(straight / "8"))


def test_starting_over_moves_the_previous_records_aside(straight, tmp_path):
    workdir = copy_of(straight, tmp_path)
    before = snapshot(workdir / "tracking")
    result = cli(
        workdir,
        **{"checkpoint.restore_checkpoint_if_exists": False, "checkpoint.clear_previous_checkpoints": True},
    )
    assert result.returncode == 0, result.stderr
    assert comparable(rows(workdir)) == comparable(rows(straight / "8"))  # only the new run's rows
    (aside,) = (workdir / "superseded").iterdir()
    assert snapshot(aside / "tracking") == before  # the old rows kept, byte for byte
    assert sorted(os.listdir(aside)) == ["previews", "tracking"]


def test_a_changed_model_shape_is_one_message_naming_the_key_and_nothing_is_written(straight, tmp_path):
    workdir = copy_of(straight, tmp_path)
    before = snapshot(workdir)
    result = cli(workdir, **{"model.width": 32})
    (line,) = assert_short_failure(result, 2)
    assert "cannot resume from step 8" in line
    assert "config.model.width: 16 -> 32" in line
    assert "mlp/affine0/b (32,) float32 -> (64,) float32" in line
    assert snapshot(workdir) == before


def test_num_steps_below_the_stored_step_exits_2_and_writes_nothing(straight, tmp_path):
    workdir = copy_of(straight, tmp_path)
    before = snapshot(workdir)
    result = cli(workdir, **{"train.num_steps": 4})
    (line,) = assert_short_failure(result, 2)
    assert "config.train.num_steps=4 is below the step this run would resume from (8" in line
    assert snapshot(workdir) == before


def test_a_changed_batch_size_is_named_and_the_data_position_carried_over_by_example(straight, tmp_path):
    workdir = copy_of(straight, tmp_path)
    result = cli(workdir, **{"train.num_steps": 12, "dataset.batch_size": 32})
    assert result.returncode == 0, result.stderr
    # 8 batches of 16 are 128 examples into epoch 0: batch 4 of 32 starts at example 128.
    assert (
        "config.dataset.batch_size: 16 -> 32; data position carried over by example index: epoch 0, "
        "128 examples in (batch 8 of 16) -> epoch 0 batch 4 of 32"
    ) in result.stdout
    # ... and the run went on from there: 4 more batches of 32 end at batch 8 of epoch 0.
    state, position = Checkpoints(str(workdir / "checkpoints")).restore(share=DataPartition())
    assert int(state.step) == 12
    assert position is not None and json.loads(position) == {"epoch": 0, "batch": 8}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"seed": -1}, "config.seed=-1 is invalid: expected an int in [0, 2**32)"),
        (
            {"optimizer.learning_rate": "inf"},
            "config.optimizer.learning_rate=inf is invalid: expected a finite",
        ),
        ({"optimizer.b2": 1.0}, "config.optimizer.b2=1.0 is invalid: expected a float in [0, 1)"),
    ],
)
def test_seed_and_optimizer_numbers_are_checked_before_any_work(tmp_path, overrides, message):
    # Checked before compiling: JAX logs every compilation it starts (JAX_LOG_COMPILES), and the
    # run's compilation cache, a fresh directory here, would receive every program it compiled.
    cache = tmp_path / "cache"
    result = subprocess.run(
        command(tmp_path / "run", "mixture", **overrides),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**env(), "JAX_LOG_COMPILES": "1", "JAX_COMPILATION_CACHE_DIR": str(cache)},
        timeout=900,
    )
    (line,) = assert_short_failure(result, 2)
    assert message in line
    assert not (tmp_path / "run").exists()
    assert "Compiling " not in result.stderr and "XLA compilation" not in result.stderr, result.stderr
    assert not cache.exists() or not any(cache.iterdir())


def test_the_skip_brake_stops_like_stop_after_saving_the_last_good_state(tmp_path):
    workdir = tmp_path / "run"
    # lr 1e9: the first real update makes the loss overflow, and every later update is skipped.
    result = cli(workdir, **{"optimizer.learning_rate": 1e9, "train.nonfinite": "skip"})
    lines = assert_short_failure(result, 1)
    assert lines[0].startswith("error: non-finite ")
    assert "the update was not applied" in lines[0]
    step = Checkpoints(str(workdir / "checkpoints")).latest
    assert f"Last good checkpoint: {workdir / 'checkpoints' / str(step)}." in lines[0]
    assert "The skip policy dropped 2 of the last 2 updates, more than the allowed fraction 0.5" in lines[0]
    traceback_file = lines[-1].split("full traceback: ")[1]
    assert traceback_file.startswith(str(workdir / "logs"))
    assert "NonFiniteError" in pathlib.Path(traceback_file).read_text()
    state, _ = Checkpoints(str(workdir / "checkpoints")).restore()
    assert int(state.step) == step
    assert all(np.all(np.isfinite(leaf)) for leaf in jax_leaves(state.params))
    train = [r for r in rows(workdir) if r["category"] == "train"]
    assert train[-1]["step"] == step and train[-1]["skipped_updates"] == 2


def test_a_checkpoint_whose_data_item_is_gone_is_set_aside_and_the_run_falls_back(straight, tmp_path):
    # Its save wrote a data position (orbax's step metadata names the item); without it a resume
    # would silently restart the data stream, so the step is damaged like any other.
    workdir = copy_of(straight, tmp_path)
    shutil.rmtree(workdir / "checkpoints" / "8" / "data")
    damaged = snapshot(workdir / "checkpoints" / "8")
    line, aside = resume_past_damage(workdir)
    assert line.endswith(
        f"resuming from step 4 "
        f"(checkpoint step 8 in {workdir / 'checkpoints'} is damaged: items ['data'] are missing)"
    )
    assert snapshot(aside) == damaged
    assert_like_a_straight_run(workdir, straight)


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def largest_file(directory):
    """The item's largest file of array bytes: an OCDBT ``d/`` file, or a leaf's chunk beside its
    ``.zarray`` (the per-leaf format a small state is written in), never its checksums file."""
    arrays = [
        p
        for p in directory.rglob("*")
        if p.is_file()
        and (p.parent.name == "d" or ((p.parent / ".zarray").is_file() and not p.name.startswith(".")))
    ]
    return max(arrays, key=lambda p: p.stat().st_size)


def final_state(workdir):
    state, position = Checkpoints(str(workdir / "checkpoints")).restore(share=DataPartition())
    return jax_leaves(state), position


def resume_past_damage(workdir, step: str = "8"):
    """Resume to step 12 past a damaged latest ``step``: the run succeeds, says once that the
    step was kept aside and it resumed from step 4; returns that line and the step's new place."""
    result = cli(workdir, **{"train.num_steps": 12})
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "is damaged or incomplete" in line]
    (aside,) = workdir.glob("checkpoints.damaged-*")
    assert line.startswith(
        f"checkpoint step {step} is damaged or incomplete, kept aside in {aside}/{step}; resuming from step 4"
    ), line
    return line, aside / step


def assert_like_a_straight_run(workdir, straight):
    """The same state, data position and history as a run never interrupted."""
    ours, straight_ones = final_state(workdir), final_state(straight / "12")
    assert ours[1] == straight_ones[1]
    for a, b in zip(ours[0], straight_ones[0], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert comparable(rows(workdir)) == comparable(rows(straight / "12"))


@pytest.mark.parametrize("damage", ["flip 16 bytes", "truncate"])
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_run_falls_back_to_the_intact_one(
    straight, tmp_path, damage
):
    workdir = copy_of(straight, tmp_path)
    victim = largest_file(workdir / "checkpoints" / "8" / "params")
    data = bytearray(victim.read_bytes())
    written = len(data)
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[100:116] = bytes(b ^ 0xFF for b in data[100:116])
    victim.write_bytes(bytes(data))
    damaged = snapshot(workdir / "checkpoints" / "8")
    line, aside = resume_past_damage(workdir)
    reason = (
        "does not match its checksum"
        if damage != "truncate"
        else f"holds {len(data)} bytes, {written} were written"
    )
    assert f"item 'params', file {victim}" in line and reason in line
    assert snapshot(aside) == damaged  # kept as it was found, for a person to look at
    assert_like_a_straight_run(workdir, straight)  # resumed from step 4


def test_one_flipped_bit_in_a_step_asked_for_by_number_is_an_error_naming_step_item_and_file(
    straight, tmp_path
):
    workdir = copy_of(straight, tmp_path)
    victim = largest_file(workdir / "checkpoints" / "8" / "opt_state")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    before = snapshot(workdir / "checkpoints")
    result = cli(workdir, **{"train.num_steps": 12, "checkpoint.step_to_restore": 8})
    (line, *_rest) = assert_short_failure(result, 1)
    assert (
        f"error: checkpoint step 8 is damaged: item 'opt_state', file {victim} does not match its checksum"
        in line
    )
    assert snapshot(workdir / "checkpoints") == before  # an explicit choice is not replaced or moved
    assert not list(workdir.glob("checkpoints.damaged-*"))


def _edit_metadata(step_dir, **custom):
    path = step_dir / "_CHECKPOINT_METADATA"
    meta = json.loads(path.read_text())
    meta["custom_metadata"].update(custom)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("checksums of another shape", "its checksums {step}/params/dew_checksums.json are unreadable"),
        (
            "metadata records another step count",
            "the restored state is at step 8, its metadata records step 9",
        ),
        ("metadata keyed by another step", "its metadata records step 8 under key 9"),
        (
            "directory renamed",
            "the restored state is at step 8, its metadata records step 8, in a directory named 10",
        ),
    ],
)
def test_a_latest_step_whose_records_disagree_with_it_is_set_aside_like_other_damage(
    straight, tmp_path, damage, reason
):
    """Damage dew's own files could show after a crash or a hand's edit never stops every
    restart: the step is set aside and the run resumes from the intact one before it."""
    workdir = copy_of(straight, tmp_path)
    step_dir = workdir / "checkpoints" / "8"
    if damage == "checksums of another shape":
        (step_dir / "params" / "dew_checksums.json").write_text('{"files": []}')
    elif damage == "metadata records another step count":
        _edit_metadata(step_dir, num_steps=9)
    elif damage == "metadata keyed by another step":
        _edit_metadata(step_dir, step=9)
    else:
        step_dir = step_dir.rename(workdir / "checkpoints" / "10")
    damaged = snapshot(step_dir)
    line, aside = resume_past_damage(workdir, step_dir.name)
    assert reason.format(step=step_dir) in line, line
    assert snapshot(aside) == damaged
    assert_like_a_straight_run(workdir, straight)
