"""The local tracker survives what a kill, a power loss or a full disk leaves in scalars.jsonl:
a torn (or zero-filled) last row is trimmed, a damaged row elsewhere is moved aside on the next
rewrite, and no damaged row ever stops a run or costs a whole row."""

from __future__ import annotations

import json

from dew.tracking.trackers import LocalTracker, LoggingCategory


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_rows(tracker, steps):
    for step in steps:
        tracker.log(LoggingCategory.TRAIN_METRICS, {"loss": float(step)}, step)
    tracker.close()


def test_a_torn_last_row_is_trimmed_before_the_next_append(tmp_path, capsys):
    tracker = LocalTracker(str(tmp_path))
    write_rows(tracker, [1, 2, 3])
    path = tmp_path / "scalars.jsonl"
    whole = path.read_bytes()
    last_row = whole.rstrip(b"\n").rsplit(b"\n", 1)[1]
    path.write_bytes(whole[: len(whole) - len(last_row) // 2])  # cut mid-row, as a kill would
    write_rows(LocalTracker(str(tmp_path)), [3, 4])
    assert [r["step"] for r in rows(path)] == [1, 2, 3, 4]
    assert "trimmed a torn last row" in capsys.readouterr().err


def test_zero_bytes_after_the_last_row_are_trimmed(tmp_path):
    tracker = LocalTracker(str(tmp_path))
    write_rows(tracker, [1, 2])
    path = tmp_path / "scalars.jsonl"
    path.write_bytes(path.read_bytes() + b"\0" * 37)  # what a power loss can leave (size grew)
    write_rows(LocalTracker(str(tmp_path)), [3])
    assert [r["step"] for r in rows(path)] == [1, 2, 3]


def test_cleanup_after_restore_tolerates_a_torn_row_and_keeps_damaged_rows_aside(tmp_path):
    tracker = LocalTracker(str(tmp_path))
    write_rows(tracker, [1, 2, 3, 4])
    path = tmp_path / "scalars.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = b'{"step": 2, "categ\n'  # a damaged row in the middle
    path.write_bytes(b"".join(lines) + b'{"step": 5, "cat')  # and a torn one at the end
    tracker = LocalTracker(str(tmp_path))
    tracker.log(LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION, {}, 3)
    write_rows(tracker, [4])
    assert [r["step"] for r in rows(path)] == [1, 3, 4]
    # The torn last row is trimmed (it never was a row); the damaged one is kept aside.
    assert (tmp_path / "scalars.jsonl.damaged").read_bytes() == b'{"step": 2, "categ\n'


def test_cleanup_at_step_zero_drops_everything_a_run_killed_before_its_first_checkpoint_wrote(tmp_path):
    tracker = LocalTracker(str(tmp_path))
    write_rows(tracker, [10, 20])
    tracker = LocalTracker(str(tmp_path))
    tracker.log(LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION, {}, 0)
    write_rows(tracker, [10])
    assert [r["step"] for r in rows(tmp_path / "scalars.jsonl")] == [10]
