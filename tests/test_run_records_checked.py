"""What the checkpointing layer reads back is checked when read: ``run.json`` as a run's start
history and the records a checkpoint step's metadata keeps. A malformed one is refused in one
line naming the file (a ``python -m dew.main`` exit status 2 for run.json), never a traceback from
deep inside a resume and never a silently wrong carry-over."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import optax
import pytest

from dew.checkpointing import CheckpointDamagedError, Checkpoints
from dew.failures import exit_code
from dew.run_records import RunMetadataError, read_run, read_run_metadata, record_start, starts, writer_of
from dew.training.state import TrainState

GOOD_START = {
    "time": "2026-12-05T00:00:00+00:00",
    "resumed_from": 0,
    "config": {"dataset": {"batch_size": 16}},
    "processes": 1,
    "dew_version": "0.1",
}


def start(**changes):
    return {**GOOD_START, **changes}


MALFORMED = [
    ({"starts": "abc"}, "starts is 'abc', expected a list"),
    ({"starts": [["x"]]}, r"starts\[0\] is \['x'\], expected an object"),
    ({"starts": [start(), 5]}, r"starts\[1\] is 5, expected an object"),
    ({"starts": [start(config="lr=1")]}, r"starts\[0\].config is 'lr=1', expected an object"),
    ({"starts": [start(processes="two")]}, r"starts\[0\].processes is 'two', expected an int >= 1"),
    ({"starts": [start(processes=0)]}, r"starts\[0\].processes is 0, expected an int >= 1"),
    ({"starts": [start(resumed_from=-3)]}, r"starts\[0\].resumed_from is -3, expected an int >= 0"),
    ({"starts": [start(resumed_from=True)]}, r"starts\[0\].resumed_from is True"),
    ({"starts": [start(config={"dataset": {"batch_size": "32"}})]}, r"batch_size is '32', expected an int"),
    ({"starts": [start(config={"dataset": [1]})]}, r"config.dataset is \[1\], expected an object"),
    ({"starts": [start(time=5)]}, r"starts\[0\].time is 5, expected a string"),
    ({"config": [1, 2]}, r"config is \[1, 2\], expected an object"),
    ({"label": 3}, "label is 3, expected a string"),
    ({"lost_history": {"a": 1}}, "lost_history is .*, expected a list"),
    ({"lost_history": [{"before_step": "9"}]}, r"lost_history\[0\] is .*before_step"),
]


@pytest.mark.parametrize(("metadata", "problem"), MALFORMED)
def test_a_malformed_run_history_is_refused_in_one_line_naming_the_file(tmp_path, metadata, problem):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(metadata))
    for read in (starts, read_run, lambda w: writer_of(w, 5)):
        with pytest.raises(RunMetadataError, match=problem) as caught:
            read(str(tmp_path))
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{path} is malformed: ")
    with pytest.raises(RunMetadataError):  # a new start is not recorded over it
        record_start(str(tmp_path), {"dataset": {"batch_size": 8}}, 4)
    assert json.loads(path.read_text()) == metadata  # never replaced
    assert exit_code(caught.value) == 2  # input a person can fix
    assert read_run_metadata(str(tmp_path)) == metadata  # the stix reader reads any JSON object


def test_a_history_this_module_wrote_and_an_older_one_read_as_they_are(tmp_path):
    record_start(str(tmp_path), {"dataset": {"batch_size": 8}}, 0, processes=2)
    record_start(str(tmp_path), {"dataset": {"batch_size": 16}}, 6)
    assert [s["resumed_from"] for s in starts(str(tmp_path))] == [0, 6]
    writer = writer_of(str(tmp_path), 4)
    assert writer is not None and writer["processes"] == 2
    (tmp_path / "run.json").write_text(json.dumps({"config": {"seed": 1}, "label": "old"}))  # before starts
    assert starts(str(tmp_path))[0]["config"] == {"seed": 1}


def tiny(step: int) -> TrainState:
    params = {"w": jnp.full((2,), float(step))}
    return TrainState(
        step=jnp.int32(step),
        params=params,
        opt_state=optax.sgd(0.1).init(params),
        ema=params,
        rng=jax.random.PRNGKey(0),
    )


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("metrics", "low", "metrics='low'"),
        ("metrics", {"loss": "0.1"}, "metrics="),
        ("empty_items", "opt_state", "empty_items='opt_state'"),
        ("num_steps", "3", "num_steps='3'"),
        ("rng_impl", 7, "rng_impl=7"),
        ("ema", {"decay": "0.9"}, "ema="),
        ("ema", {"decay": 1.5}, "ema="),
        ("ema", {"decay": 0.9, "accumulation": 0}, "ema.accumulation=0"),
        ("ema", {"decay": 0.9, "tracked": "w"}, "ema.tracked='w'"),
    ],
)
def test_a_malformed_step_metadata_record_is_refused_naming_the_file(tmp_path, key, value, problem):
    c = Checkpoints(str(tmp_path / "c"), asynchronous=False, ema={"decay": 0.9, "accumulation": 1})
    c.save(3, tiny(3), None, {"loss": 0.5})
    c.close()
    path = tmp_path / "c" / "3" / "_CHECKPOINT_METADATA"
    meta = json.loads(path.read_text())
    meta["custom_metadata"][key] = value
    path.write_text(json.dumps(meta))
    reopened = Checkpoints(str(tmp_path / "c"), read_only=True)
    for read in (
        lambda: reopened.restore(None, 3),
        lambda: reopened.restore_ema(None, 3),
        reopened.best_step,
    ):
        with pytest.raises(CheckpointDamagedError, match=problem) as caught:
            read()
        assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_a_full_disk_at_run_json_names_the_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Once: ``[Errno 28] No space left on device`` naming no file, and an empty ``.run.*.json``
    left behind at every restart."""
    import errno
    import io
    import os

    from dew.failures import report

    record_start(str(tmp_path), {"seed": 0}, 0)
    before = (tmp_path / "run.json").read_text()
    fdopen = os.fdopen

    class Full(io.TextIOWrapper):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: Full(fdopen(fd, mode + "b")))
    with pytest.raises(OSError) as caught:
        record_start(str(tmp_path), {"seed": 0}, 4)
    path = tmp_path / "run.json"
    assert str(caught.value) == f"[Errno 28] cannot write {path}: No space left on device"
    assert caught.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no .run.*.json
    assert path.read_text() == before  # the history written before is intact
    stream = io.StringIO()
    monkeypatch.undo()
    report(caught.value, str(tmp_path / "elsewhere"), stream=stream)
    assert stream.getvalue().startswith(f"error: [Errno 28] cannot write {path}: No space left on device\n")
