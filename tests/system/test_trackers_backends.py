"""Each tracker backend after a short real run, read back by its own reader; the fan-out with a
broken sink; failures of background writers surfacing; process 0 as the only writer."""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers_tracking import event_accumulator, offline_run_dirs, wandb_history
from PIL import GifImagePlugin, Image

from dew.artifacts import ImageGrid, TextSamples, VideoGrid
from dew.tracking.background import BackgroundTracker
from dew.tracking.trackers import (
    LocalTracker,
    LoggingCategory,
    MLflowTracker,
    TensorBoardTracker,
    Tracker,
    Trackers,
    WandbTracker,
    make_trackers,
    validate_tracking,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN, EVAL, BEST = LoggingCategory.TRAIN_METRICS, LoggingCategory.EVAL_METRICS, LoggingCategory.BEST_MODEL
CLEANUP = LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION
GRID = ImageGrid(np.linspace(-1, 1, 4 * 8 * 8).reshape(4, 8, 8, 1), columns=2)


def moving_clips(channels: int) -> VideoGrid:
    """Two clips of three frames that differ (a GIF encoder merges identical frames)."""
    frames = np.linspace(-1, 1, 3)[None, :, None, None, None]
    return VideoGrid(np.broadcast_to(frames, (2, 3, 8, 8, channels)), fps=4)


class BrokenAtStep(Tracker):
    def __init__(self, step: int):
        self.step = step

    def _write_scalars(self, category, values, step):
        if step == self.step:
            raise OSError(f"disk on fire at step {step}")


def test_all_four_backends_read_back_by_their_own_readers_and_a_broken_sink_stops_none(tmp_path):
    from mlflow import MlflowClient

    tracking = {"backends": ("local", "tensorboard", "mlflow", "wandb"), "mlflow_experiment": "digits"}
    built = make_trackers(tracking, str(tmp_path), config={"optimizer": {"learning_rate": 0.01}, "seed": 3})
    local, tensorboard, mlflow, wandb = built.sinks
    seen: list[tuple[LoggingCategory, int]] = []
    trackers = Trackers([local, tensorboard, BrokenAtStep(2), mlflow, wandb])
    trackers.attach(lambda category, values, step: seen.append((category, step)))
    for step in (1, 2, 3):
        window = [0.01 * step, 0.09 * step]  # per-step MSEs: the rmse is of their mean
        values = {"loss": 1.0 / step, "mse_denoised": float(np.mean(window))}
        if step == 2:
            with pytest.raises(OSError, match="disk on fire at step 2"):
                trackers.log(TRAIN, values, step)
        else:
            trackers.log(TRAIN, values, step)
    trackers.log(EVAL, {"loss": 0.25}, 3)
    trackers.log(BEST, {"eval_loss": 0.25}, 3)
    trackers.log_artifact("samples", GRID, 3)
    trackers.close()
    assert [s for c, s in seen if c is TRAIN] == [1, 2, 3]  # the callback saw step 2 too
    rmse = [float(np.sqrt(np.mean([0.01 * s, 0.09 * s]))) for s in (1, 2, 3)]

    rows = [json.loads(line) for line in (tmp_path / "scalars.jsonl").read_text().splitlines()]
    assert [r["rmse_denoised"] for r in rows if r["category"] == "train"] == pytest.approx(rmse)
    assert {"step": 3, "category": "best_model", "eval_loss": 0.25} in rows

    events = event_accumulator(str(tmp_path / "tensorboard"))
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3]
    assert [e.value for e in events.Scalars("train/rmse_denoised")] == pytest.approx(rmse)
    assert [e.value for e in events.Scalars("best_model/eval_loss")] == [0.25]
    (image,) = events.Images("samples")
    png = Image.open(io.BytesIO(image.encoded_image_string))
    assert (image.step, png.format, png.size) == (3, "PNG", (image.width, image.height))

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    run_id = json.loads((tmp_path / "mlflow" / "run.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"optimizer.learning_rate": "0.01", "seed": "3"}
    assert run.data.tags["dew.best_step"] == "3"
    history = client.get_metric_history(run_id, "train/rmse_denoised")
    assert [m.step for m in history] == [1, 2, 3]
    assert [m.value for m in history] == pytest.approx(rmse)
    (png_path,) = [a.path for a in client.list_artifacts(run_id, "images") if a.path.endswith(".png")]
    assert png_path.startswith("images/samples+step+3+")
    local_png = client.download_artifacts(run_id, png_path, str(tmp_path / "download"))
    assert Image.open(local_png).size == png.size

    (run_dir,) = offline_run_dirs(str(tmp_path / "wandb"))
    history_rows = wandb_history(run_dir)
    assert [r["_step"] for r in history_rows] == [1, 2, 3]
    assert [r["train/rmse_denoised"] for r in history_rows] == pytest.approx(rmse)
    assert history_rows[-1]["eval/loss"] == 0.25 and history_rows[-1]["samples/_type"] == "image-file"
    assert os.path.exists(os.path.join(run_dir, "files", history_rows[-1]["samples/path"]))

    # A restart of the same workdir continues the same MLflow run and marks the restore.
    again = MLflowTracker("digits", directory=str(tmp_path / "mlflow"))
    again.log(CLEANUP, {}, 2)
    again.log(TRAIN, {"loss": 0.4}, 3)
    again.close()
    assert json.loads((tmp_path / "mlflow" / "run.json").read_text())["run_id"] == run_id
    assert client.get_run(run_id).data.tags["dew.restored_from_step"] == "2"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")][-1] == (3, 0.4)


def test_tensorboard_writes_histograms_media_text_and_config_and_purges_after_a_restore(tmp_path):
    tracker = TensorBoardTracker(str(tmp_path), config={"model": {"channels": 8}})
    assert not tmp_path.joinpath("x").exists() and not os.listdir(tmp_path)  # nothing before a value
    for step in (1, 2, 3, 4):
        tracker.log(TRAIN, {"loss": float(step), "weights": np.arange(100.0) * step}, step)
    tracker.log_artifact("samples", GRID, 4)
    tracker.log(CLEANUP, {}, 2)  # restored step 2: what steps 3 and 4 wrote is abandoned
    tracker.log(TRAIN, {"loss": 30.0}, 3)
    tracker.close()

    events = event_accumulator(str(tmp_path))
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    (histogram, *_) = events.Histograms("train/weights")
    assert (histogram.step, histogram.histogram_value.num, histogram.histogram_value.max) == (1, 100, 99)
    (config,) = events.Tensors("config")
    assert '"channels": 8' in config.tensor_proto.string_val[0].decode()
    assert [h.step for h in events.Histograms("train/weights")] == [1, 2]
    assert events.Images("samples") == []  # logged at step 4: purged


def test_tensorboard_video_and_text_are_gif_and_text_summaries(tmp_path):
    tracker = TensorBoardTracker(str(tmp_path))
    tracker.log_artifact("clip", moving_clips(1), 1)
    tracker.log_artifact("text", TextSamples(np.array([[5, 6]]), text=("a cat",), prompt="draw"), 1)
    tracker.close()
    events = event_accumulator(str(tmp_path))
    (clip,) = events.Images("clip")
    gif = Image.open(io.BytesIO(clip.encoded_image_string))
    assert isinstance(gif, GifImagePlugin.GifImageFile) and gif.n_frames == 3
    (text,) = events.Tensors("text")
    assert "0: a cat" in text.tensor_proto.string_val[0].decode()


def test_wandb_offline_run_has_history_rows_media_and_resumes_its_id(tmp_path):
    tracker = WandbTracker("dew-tests", directory=str(tmp_path), config={"seed": 1})
    tracker.log(TRAIN, {"loss": 1.0, "weights": np.arange(10.0)}, 1)
    tracker.log(TRAIN, {"loss": 0.5}, 2)
    tracker.log(EVAL, {"loss": 0.7}, 2)
    tracker.log_artifact("text", TextSamples(np.array([[1, 2], [3, 4]])), 2)
    tracker.close()
    run_id = json.loads((tmp_path / "run.json").read_text())["run_id"]
    (run_dir,) = offline_run_dirs(str(tmp_path))
    assert run_dir.endswith(run_id)
    rows = wandb_history(run_dir)
    assert [(r["_step"], r["train/loss"]) for r in rows] == [(1, 1.0), (2, 0.5)]
    assert rows[0]["train/weights/_type"] == "histogram" and rows[1]["eval/loss"] == 0.7
    assert rows[1]["text/_type"] == "table-file"

    again = WandbTracker("dew-tests", directory=str(tmp_path))
    again.log(TRAIN, {"loss": 0.25}, 3)
    again.close()
    assert len(offline_run_dirs(str(tmp_path))) == 2
    names = [os.path.basename(d) for d in offline_run_dirs(str(tmp_path))]
    assert len(names) == 2 and all(re.fullmatch(rf"offline-run-\d+_\d+-{run_id}(-\d+)?", n) for n in names)


class Flaky(BackgroundTracker):
    """A background tracker whose backend fails on chosen steps (no backend library)."""

    def __init__(self, fail_steps=(), fail_open=False):
        super().__init__()
        self.fail_steps, self.fail_open, self.written, self.closed = set(fail_steps), fail_open, [], False
        self.threads: set[str] = set()

    def _open(self):
        if self.fail_open:
            raise ImportError("No module named 'absent_backend'")

    def _emit(self, batch):
        self.threads.add(threading.current_thread().name)
        for report in batch:
            if report.step in self.fail_steps:
                raise OSError(f"store unavailable at step {report.step}")
            self.written.append(report.step)

    def _close_backend(self):
        self.closed = True


def test_background_failures_surface_on_the_callers_thread_and_later_reports_still_land():
    tracker = Flaky(fail_steps={2})
    for step in (1, 2):
        tracker.log(TRAIN, {"loss": 1.0}, step)
    with pytest.raises(OSError, match="store unavailable at step 2"):
        tracker.flush()
    tracker.log(TRAIN, {"loss": 1.0}, 3)
    tracker.close()
    assert tracker.written == [1, 3] and tracker.closed
    assert tracker.threads == {"dew-Flaky"}  # written off the caller's thread
    with pytest.raises(RuntimeError, match="Flaky is closed"):
        tracker.log(TRAIN, {"loss": 1.0}, 4)


def test_a_backend_that_cannot_open_fails_the_fan_out_at_close_but_local_has_everything(tmp_path):
    local = LocalTracker(str(tmp_path))
    trackers = Trackers([Flaky(fail_open=True), local])
    trackers.log(TRAIN, {"loss": 1.0}, 1)  # queued: the failure is not known yet
    with pytest.raises(ImportError, match="absent_backend"):
        trackers.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "scalars.jsonl").read_text().splitlines()] == [1]


def test_a_writer_process_runs_the_backend_and_its_failures_surface_in_the_parent(tmp_path):
    good = TensorBoardTracker(str(tmp_path / "tb"), writer="process")
    good.log(TRAIN, {"loss": 0.5, "weights": np.arange(10.0)}, 1)
    good.log_artifact("samples", GRID, 1)
    good.flush()  # written by the child when flush returns
    events = event_accumulator(str(tmp_path / "tb"))
    assert [e.value for e in events.Scalars("train/loss")] == [0.5]
    assert len(events.Images("samples")) == 1 and len(events.Histograms("train/weights")) == 1
    good.close()

    (tmp_path / "file").write_text("not a directory")
    bad = TensorBoardTracker(str(tmp_path / "file" / "tb"), writer="process")
    bad.log(TRAIN, {"loss": 0.5}, 1)
    with pytest.raises(OSError, match="in the tracker's writer process"):
        bad.close()


def test_local_tracker_writes_gif_and_text_and_drops_what_follows_a_restored_step(tmp_path):
    tracker = LocalTracker(str(tmp_path))
    for step in (1, 2, 3):
        tracker.log(TRAIN, {"loss": float(step)}, step)
        tracker.log_artifact("clip", moving_clips(3), step)
        tracker.log_artifact("text", TextSamples(np.array([[1, 2]]), text=("hi",), prompt="p"), step)
    gif = Image.open(tmp_path / "videos" / "clip_00000003.gif")
    assert isinstance(gif, GifImagePlugin.GifImageFile) and gif.n_frames == 3
    assert (tmp_path / "text" / "text_00000003.txt").read_text() == "prompt: p\n\n0: hi\n"
    tracker.log(CLEANUP, {}, 1)
    tracker.log(TRAIN, {"loss": 20.0}, 2)
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "scalars.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 20.0)]
    assert sorted(os.listdir(tmp_path / "videos")) == ["clip_00000001.gif"]
    assert sorted(os.listdir(tmp_path / "text")) == ["text_00000001.html", "text_00000001.txt"]


def test_rmse_is_the_root_of_the_window_mean_through_the_metrics_stage():
    import jax.numpy as jnp
    from helpers_trainer import empty_state

    from dew.training.loop import StepContext
    from dew.training.stages import MetricsStage

    class Recording(Tracker):
        def __init__(self):
            self.seen = []

        def _write_scalars(self, category, values, step):
            self.seen.append((category, values, step))

    recording = Recording()
    stage = MetricsStage(recording, every=2, batch_size=4)
    for step, mse in ((1, 0.01), (2, 0.09)):
        ctx = StepContext(step=step, state=empty_state(step), stats={"mse_x": jnp.float32(mse)}, final=False)
        stage.observe(ctx)
    stage.run(ctx)
    ((values, step),) = [(values, step) for category, values, step in recording.seen if category == TRAIN]
    assert step == 2
    assert values["rmse_x"] == pytest.approx(np.sqrt(0.05), rel=1e-6)  # sqrt of the mean: 0.2236
    assert values["rmse_x"] != pytest.approx(np.mean(np.sqrt([0.01, 0.09])), rel=1e-3)  # not 0.2


def test_building_every_tracker_imports_no_backend_and_writes_nothing(tmp_path):
    code = (
        "import json, sys\n"
        "from dew.tracking.trackers import make_trackers\n"
        f"t = make_trackers({{'backends': ('local', 'tensorboard', 'mlflow', 'wandb')}}, {str(tmp_path)!r})\n"
        "t.close()\n"
        "print(json.dumps([m for m in ('mlflow', 'wandb', 'tensorboard', 'tensorflow') if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("tracking", "message"),
    [
        ({"backends": ("local", "tensorbored")}, "config.tracking.backends=('local', 'tensorbored')"),
        ({"backends": ("local", "local")}, "names a backend twice"),
        ({"backends": ("wandb",), "wandb_mode": "cloud"}, "config.tracking.wandb_mode='cloud'"),
        ({"backends": (), "mlflow_uri": 5}, "config.tracking.mlflow_uri=5"),
    ],
)
def test_tracking_config_errors_name_the_key_and_the_choices(tracking, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_tracking(tracking)


_TWO_PROCESSES = """
import json, os, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize("127.0.0.1:{port}", num_processes=2, process_id=int(sys.argv[1]))
from dew.tracking.trackers import LocalTracker, TensorBoardTracker, LoggingCategory
local = LocalTracker({local!r})
board = TensorBoardTracker(os.path.join({board!r}, "p" + sys.argv[1]))
for step in (1, 2):
    local.log(LoggingCategory.TRAIN_METRICS, {{"process": jax.process_index()}}, step)
    board.log(LoggingCategory.TRAIN_METRICS, {{"process": jax.process_index()}}, step)
local.close(); board.close()
jax.distributed.shutdown()
"""


def test_only_process_zero_writes_in_a_real_two_process_run(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = _TWO_PROCESSES.format(port=port, local=str(tmp_path / "local"), board=str(tmp_path / "tb"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(i)], cwd=ROOT, env=env, stderr=subprocess.PIPE)
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "local" / "scalars.jsonl").read_text().splitlines()]
    assert [(r["step"], r["process"]) for r in rows] == [(1, 0), (2, 0)]
    assert sorted(os.listdir(tmp_path / "tb")) == ["p0"]  # process 1 never opened its event file


def test_an_attached_console_logger_sees_every_category_and_summarises_arrays():
    from dew.tracking.console import log_metrics_to_line

    out = io.StringIO()
    trackers = Trackers()
    trackers.attach(lambda category, values, step: log_metrics_to_line(category, values, step, stream=out))
    trackers.log(BEST, {"eval_loss": 0.25, "step": 7, "weights": np.arange(4.0)}, 7)
    trackers.log(CLEANUP, {"restored_step": 5}, 5)
    assert out.getvalue().splitlines() == [
        "[best_model step 7] eval_loss=0.25  step=7  weights=array[4] mean=1.5",
        "[cleanup_after_ckpt_restoration step 5] restored_step=5",
    ]
