"""The pieces behind readable restarts, in-process: data positions carried over by example
index, run.json's history of starts, previews that cannot be scored, and how failures print."""

from __future__ import annotations

import io
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_trainer import empty_state

from dew.artifacts import ImageGrid
from dew.checkpointing.restore import (
    ResumeMismatchError,
    config_changes,
    remap_position,
    tree_differences,
)
from dew.config import ConfigError
from dew.failures import exit_code, report
from dew.run_records import record_start, set_aside_records, starts, writer_of
from dew.tracking.trackers import LoggingCategory, Tracker
from dew.training.loop import StepContext


def position(epoch, batch):
    return json.dumps({"epoch": epoch, "batch": batch}).encode()


@pytest.mark.parametrize(
    ("old", "new", "where", "expected", "note"),
    [
        (16, 32, (0, 8), (0, 4), None),  # 128 examples = 4 batches of 32, exactly
        (16, 24, (1, 8), (1, 6), "16 examples of epoch 1 skipped"),  # 128 -> 144 = 6 * 24
        (32, 16, (2, 3), (2, 6), None),
        (16, 32, (0, 99), (1, 0), "the rest of epoch 0 is skipped"),  # 1584 examples: none left
    ],
)
def test_a_position_is_carried_over_by_example_index(old, new, where, expected, note):
    batches_per_epoch = 1617 // new
    out, account = remap_position(position(*where), old, new, batches_per_epoch)
    assert json.loads(out) == {"epoch": expected[0], "batch": expected[1]}
    assert f"-> epoch {expected[0]} batch {expected[1]} of {new}" in account
    if note:
        assert note in account
    else:
        assert "skipped" not in account


def test_an_unreadable_position_is_named_not_remapped():
    with pytest.raises(ResumeMismatchError, match="cannot be carried over from batch size 16 to 32"):
        remap_position(b"\x00\x01", 16, 32, 50)


def test_config_changes_and_tree_differences_name_what_changed():
    old = {"model": {"channels": 8, "channel_mult": [1, 2]}, "seed": 0}
    new = {"model": {"channels": 16, "channel_mult": (1, 2)}, "seed": 0}  # a tuple equals its JSON list
    assert config_changes(old, new, ("model.",)) == ["config.model.channels: 8 -> 16"]
    stored = {"a": {"w": jnp.zeros((3, 8))}, "b": jnp.zeros(2)}
    wanted = {"a": {"w": jnp.zeros((3, 16))}, "b": jnp.zeros(2)}
    assert tree_differences(stored, wanted) == ["a/w (3, 8) float32 -> (3, 16) float32"]
    # Same arrays under another container layout (the local tier's flat names) are no change.
    assert tree_differences({"['a']['w']": jnp.zeros((3, 8)), "['b']": jnp.zeros(2)}, stored) == []


def test_run_json_keeps_every_start_and_names_the_writer_of_a_step(tmp_path):
    record_start(str(tmp_path), {"optimizer": {"learning_rate": 1e9}}, 0)  # a failed first attempt
    record_start(str(tmp_path), {"optimizer": {"learning_rate": 1e-3}}, 0)
    record_start(str(tmp_path), {"optimizer": {"learning_rate": 2e-3}}, 40)
    history = starts(str(tmp_path))
    assert [(s["resumed_from"], s["config"]["optimizer"]["learning_rate"]) for s in history] == [
        (0, 1e9),
        (0, 1e-3),
        (40, 2e-3),
    ]
    metadata = json.loads((tmp_path / "run.json").read_text())
    assert metadata["config"]["optimizer"]["learning_rate"] == 2e-3  # the latest start's
    at_40, at_60 = writer_of(str(tmp_path), 40), writer_of(str(tmp_path), 60)
    assert at_40 is not None and at_40["config"]["optimizer"]["learning_rate"] == 1e-3
    assert at_60 is not None and at_60["config"]["optimizer"]["learning_rate"] == 2e-3
    assert writer_of(str(tmp_path), 0) is None


def test_setting_records_aside_moves_them_whole(tmp_path):
    (tmp_path / "tracking").mkdir()
    (tmp_path / "tracking" / "scalars.jsonl").write_text('{"step": 1}\n')
    aside = set_aside_records(str(tmp_path))
    assert aside is not None
    assert not (tmp_path / "tracking").exists()
    assert pathlib.Path(aside, "tracking", "scalars.jsonl").read_text() == '{"step": 1}\n'
    assert set_aside_records(str(tmp_path)) is None


class Collect(Tracker):
    def __init__(self):
        self.reports = []

    def _write_scalars(self, category, values, step):
        self.reports.append((category, values, step))


def test_a_preview_with_nonfinite_samples_reports_them_instead_of_scoring(tmp_path, capsys):
    from helpers_common import tiny_config

    from dew.training.trainer import Trainer

    trainer = Trainer(tiny_config(), str(tmp_path / "run"))
    state = trainer.programs.init(jax.random.PRNGKey(0), trainer.example_batch())
    diverged = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), state.params)  # what lr=1e9 leaves

    def metric(images, labels):  # a scorer that, like an SVM, refuses missing values
        raise AssertionError("a metric was asked to score NaN samples")

    grid = trainer.objective.preview(diverged, jax.random.PRNGKey(1))
    assert isinstance(grid, ImageGrid)
    assert np.isfinite(grid.images).all()  # drawn (grey), not refused by ImageGrid
    assert trainer.objective.score(grid, {"accuracy": metric}) == {
        "nonfinite_samples": float(len(grid.images))
    }
    assert (
        f"preview: {len(grid.images)} of {len(grid.images)} samples are non-finite; accuracy not scored"
        in (capsys.readouterr().out)
    )


def test_a_failure_prints_one_line_its_cause_and_where_the_traceback_is(tmp_path):
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as e:
            raise RuntimeError("checkpoint step 50 did not land in /x [tensorstore_spec='{...}']") from e
    except RuntimeError as e:
        error = e
    out = io.StringIO()
    assert report(error, str(tmp_path), stream=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == "error: checkpoint step 50 did not land in /x"
    assert lines[1] == "  cause: OSError: [Errno 28] No space left on device"
    path = lines[2].split("full traceback: ")[1]
    assert path.startswith(str(tmp_path / "logs")) and "Traceback" in pathlib.Path(path).read_text()
    assert exit_code(ConfigError("x")) == 2 and exit_code(ResumeMismatchError("x")) == 2


def test_a_long_storage_error_keeps_its_reason_when_cut_to_one_line():
    from dew.failures import _LIMIT, short

    path = "/tmp/" + "deep/" * 200 + "checkpoints/8.orbax-checkpoint-tmp/d/c7d9"
    error = RuntimeError(
        f"checkpoint step 8 did not land in {path}: Failed to write 244 bytes to file 15: "
        "No space left on device [os_error_code='28'] [tensorstore_spec='{\"driver\": \"zarr\"}']"
    )
    text = short(error)
    assert len(text) <= _LIMIT and text.startswith("checkpoint step 8 did not land in /tmp/deep/")
    assert text.endswith("…: No space left on device [os_error_code='28']")


def test_a_window_resumed_in_its_middle_is_marked_partial_and_whole_ones_are_not():
    from dew.training.stages import MetricsStage

    tracker = Collect()
    stage = MetricsStage(tracker, every=4, batch_size=16)
    for step in range(6, 13):  # resumed from step 5: the window 5..8 was only partly seen
        ctx = StepContext(
            step=step, state=empty_state(step), stats={"loss": jnp.asarray(float(step))}, final=False
        )
        stage.observe(ctx)
        if step % 4 == 0:
            stage.run(ctx)
    train = [
        (step, values)
        for category, values, step in tracker.reports
        if category is LoggingCategory.TRAIN_METRICS
    ]
    assert train == [(8, {"loss": 7.0, "window_steps": 3.0}), (12, {"loss": 10.5})]
    system = [step for category, _, step in tracker.reports if category is LoggingCategory.SYSTEM_METRICS]
    assert system == [8, 12]  # every window has its throughput row, the first after a resume too
