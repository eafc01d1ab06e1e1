from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from dew.artifacts import ImageGrid
from dew.tracking.console import Progress, log_metrics_to_line, log_metrics_to_table
from dew.tracking.trackers import LocalTracker, LoggingCategory, Tracker, Trackers


def test_local_tracker_writes_json_lines_and_png_readable_with_stdlib_and_pillow(tmp_path):
    tracker = LocalTracker(str(tmp_path / "tracking"))
    assert not (tmp_path / "tracking").exists()  # opened on the first value, not before
    tracker.log(LoggingCategory.TRAIN_METRICS, {"loss": 0.5, "mse_x": 0.04}, 10)
    tracker.log(LoggingCategory.EVAL_METRICS, {"loss": 0.25}, 20)
    tracker.log_artifact("samples", ImageGrid(np.zeros((4, 8, 8, 1)), columns=2), 20)
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "tracking" / "scalars.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 10, "category": "train", "loss": 0.5, "rmse_x": pytest.approx(0.2)},
        {"step": 20, "category": "eval", "loss": 0.25},
    ]
    image = Image.open(tmp_path / "tracking" / "images" / "samples_00000020.png")
    assert image.size == (2 * (64 + 4) + 4, 2 * (64 + 4) + 4)


class Broken(Tracker):
    def _write_scalars(self, category, values, step):
        raise OSError("disk on fire")


class Recording(Tracker):
    def __init__(self):
        self.seen = []

    def _write_scalars(self, category, values, step):
        self.seen.append((category, values, step))


def test_fan_out_attempts_every_sink_and_raises_the_first_failure():
    before, after = Recording(), Recording()
    callbacks = []
    trackers = Trackers([before, Broken(), after])
    trackers.attach(lambda category, values, step: callbacks.append(step))
    with pytest.raises(OSError, match="disk on fire"):
        trackers.log(LoggingCategory.TRAIN_METRICS, {"loss": 1.0}, 3)
    assert before.seen == after.seen == [(LoggingCategory.TRAIN_METRICS, {"loss": 1.0}, 3)]
    assert callbacks == [3]


def test_console_loggers_convert_mse_and_format():
    line, table = io.StringIO(), io.StringIO()
    log_metrics_to_line(LoggingCategory.EVAL_METRICS, {"mse_a": 0.25, "loss": 1.0}, 5, stream=line)
    log_metrics_to_table(LoggingCategory.TRAIN_METRICS, {"mse_a": 0.25}, 5, stream=table)
    assert line.getvalue() == "[eval step 5] loss=1  rmse_a=0.5\n"
    assert "| rmse_a |   0.5 |" in table.getvalue()


def test_progress_prints_summaries_not_a_scroll_when_not_a_tty():
    out = io.StringIO()
    progress = Progress(total_steps=100, batch_size=8, stream=out, summary_every=3600)
    for step in range(10, 101, 10):
        progress.update(step, 0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step 100/100") and "ex/s" in lines[0]
