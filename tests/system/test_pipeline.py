"""``dew.pipeline`` and ``python -m dew.sample`` on a real (tiny) run: the run's own preview
reproduced bit for bit, weights read once, and one clear error per bad input with nothing written."""

from __future__ import annotations

import importlib
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

import dew
from dew.config import apply_overrides, load_config
from dew.inference import PipelineError
from dew.tracking.base import Tracker
from dew.training.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY_EDM = [
    "config.dataset.batch_size=16",
    "config.model.model_channels=8",
    "config.model.num_blocks=1",
    "config.model.channel_mult=(1,)",
    "config.model.attn_resolutions=()",
    "config.mesh.devices=1",
    "config.objective.sampling.steps=4",
    "config.objective.sampling.per_class=1",
    "config.train.num_steps=3",
    "config.train.log_every=3",
    "config.eval.every=0",
    "config.preview.every=3",
    "config.preview.metrics=()",
    "config.checkpoint.every=3",
    "config.checkpoint.keep_best=False",
]


class Capture(Tracker):
    """Keeps every artifact logged, as the objects themselves (float arrays, not PNGs)."""

    def __init__(self):
        self.artifacts = {}

    def _write_scalars(self, category, values, step):
        pass

    def _write_artifact(self, name, artifact, step):
        self.artifacts[(name, step)] = artifact


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("edm") / "run")
    capture = Capture()
    Trainer(
        apply_overrides(load_config(str(ROOT / "experiments" / "edm.py")), TINY_EDM), workdir, [capture]
    ).run()
    return workdir, capture.artifacts[("samples", 3)]


def test_pipeline_reproduces_the_runs_own_preview_bit_for_bit_and_reads_weights_once(run, tmp_path):
    workdir, previewed = run
    copy = str(tmp_path / "copy")
    shutil.copytree(workdir, copy)
    task = dew.pipeline(copy)
    assert task.step == 3 and not task.raw
    shutil.rmtree(os.path.join(copy, "checkpoints"))  # a second read would now fail
    first, second = task(), task()
    np.testing.assert_array_equal(first.images, previewed.images)  # bit for bit
    np.testing.assert_array_equal(second.images, previewed.images)
    other = task(seed=7)
    assert not np.array_equal(other.images, previewed.images)
    guided = task(classes=(3, 3), guidance=2.0, guidance_interval=(0.5, 10.0), solver="euler", steps=5)
    assert guided.images.shape == (2, 8, 8, 1)


def test_a_repeated_setting_compiles_its_draw_once(run, monkeypatch):
    task = dew.pipeline(run[0])
    traces = []
    objective_class = type(task.objective)  # the objective is built whole: count on its class
    for fn in ("draw", "generate"):
        original = getattr(objective_class, fn)

        def counted(self, *args, _original=original, _name=fn, **kwargs):
            traces.append(_name)  # runs only while jax traces
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(objective_class, fn, counted)
    task(steps=5)
    task(classes=(1, 2), steps=5, guidance=2.0)
    assert "draw" in traces and "generate" in traces
    first = len(traces)
    task(steps=5)
    task(classes=(1, 2), steps=5, guidance=2.0)
    assert len(traces) == first  # both programs reused: nothing traced again
    task(steps=6)  # a new setting is a new program
    assert len(traces) > first


def test_raw_weights_differ_from_the_ema_and_a_step_directory_is_a_source(run):
    workdir, _ = run
    raw = dew.pipeline(workdir, raw=True)
    ema = dew.pipeline(os.path.join(workdir, "checkpoints", "3"))
    assert raw.raw and ema.step == 3
    pairs = zip(jax.tree.leaves(raw.params), jax.tree.leaves(ema.params), strict=True)
    assert any(not np.array_equal(a, b) for a, b in pairs)  # 3 updates: the EMA lags the weights


@pytest.mark.parametrize(
    "make_source, kwargs, message",
    [
        (lambda w, t: str(t), {}, r"is not a dew run: no run\.json"),
        (lambda w, t: str(t / "missing"), {}, r"is not a directory"),
        (lambda w, t: w, {"step": 999}, r"has no checkpoint at step 999; it has steps \[3\]"),
    ],
)
def test_a_bad_source_or_step_is_one_clear_error(run, tmp_path, make_source, kwargs, message):
    workdir, _ = run
    with pytest.raises(PipelineError, match=message):
        dew.pipeline(make_source(workdir, tmp_path), **kwargs)


def test_an_option_the_task_does_not_take_is_one_error_naming_what_it_takes(run):
    workdir, _ = run
    task = dew.pipeline(workdir)
    with pytest.raises(
        PipelineError, match=r"Diffusion does not take option\(s\) temperature; it takes: .*seed="
    ):
        task(temperature=0.5)
    with pytest.raises(PipelineError, match=r"guidance_interval"):
        task(guidance_interval=(5.0, 1.0))


def _sample(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "dew.sample", *args], capture_output=True, text=True, env=env, cwd=ROOT
    )


def test_the_cli_writes_the_artifact_and_refuses_bad_input_with_exit_2_writing_nothing(run, tmp_path):
    workdir, _ = run
    out = tmp_path / "out"
    done = _sample(f"--workdir={workdir}", f"--out={out}", "--classes=(1,2,3)", "--seed=5")
    assert done.returncode == 0, done.stderr
    png = Image.open(out / "images" / "sample_00000003.png")
    assert png.format == "PNG"
    for args, message in (
        ([f"--workdir={tmp_path}"], "is not a dew run"),
        ([f"--workdir={workdir}", "--temperature=2"], "does not take option(s) temperature"),
        ([f"--workdir={workdir}", "--step=12"], "no checkpoint at step 12"),
        ([f"--workdir={workdir}", "--steps=1"], "steps"),
    ):
        bad = tmp_path / "bad"
        failed = _sample(*args, f"--out={bad}")
        assert failed.returncode == 2 and message in failed.stderr, failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1 and not bad.exists()


def test_the_cli_help_prints_its_usage_and_opens_no_run(capsys):
    sample = importlib.import_module("dew.sample")  # the module; dew.sample is also a function

    assert sample.main(["--help"]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("``python -m dew.sample --workdir=RUN") and "--list" in printed.out
    assert printed.err == ""


def test_a_run_whose_data_set_is_not_here_is_one_pipeline_error_naming_it(run, tmp_path):
    import json

    workdir, _ = run
    moved = tmp_path / "run"
    shutil.copytree(workdir, moved)
    metadata = json.loads((moved / "run.json").read_text())
    metadata["config"]["dataset"].update(name="cifar10", data_dir=str(tmp_path / "no_data"))
    (moved / "run.json").write_text(json.dumps(metadata))
    with pytest.raises(PipelineError, match=r"run's data set: tfds data set 'cifar10' is not prepared") as e:
        dew.pipeline(str(moved))
    assert "\n" not in str(e.value)
