"""Telemetry and evaluation: profile captures only when started, ProfileWindow traces the steps
after warm-up, evaluate runs a finite prefix, Evaluation bounds its previews, Progress is one
updating line on a terminal and periodic summaries elsewhere."""

from __future__ import annotations

import io

import jax
import numpy as np
import optax
import pytest
from helpers_trainer import Regression, regression_batches, trace_steps

from dew.artifacts import ImageGrid
from dew.objectives.base import EMASpec
from dew.telemetry import profile
from dew.tracking.console import Progress
from dew.training.evaluation import Evaluation, evaluate
from dew.training.loop import fit
from dew.training.profile import ProfileWindow
from dew.training.steps import make_eval, make_init, make_step


def regression_run():
    objective, optimizer, spec = Regression(), optax.adam(1e-2), EMASpec(decay=0.9)
    batches = regression_batches(16, 12)
    state = jax.jit(make_init(objective, optimizer, spec))(jax.random.PRNGKey(0), batches[0])
    return objective, spec, state, jax.jit(make_step(objective, optimizer, spec), donate_argnums=0), batches


def test_profile_window_traces_exactly_the_steps_after_warmup(tmp_path):
    _, _, state, step, batches = regression_run()
    window = ProfileWindow(steps=3, directory=str(tmp_path / "trace"), warmup=2)
    state = fit(state, step, iter(batches), 8, [window])
    assert window.captured_steps == [3, 4, 5]
    assert trace_steps(tmp_path / "trace") == [3, 4, 5]
    assert any(p.endswith(".xplane.pb") for p in window.traces())
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        ProfileWindow(steps=1, directory=str(tmp_path), warmup=0)


def test_profile_captures_only_on_enter_or_start(tmp_path):
    capture = profile(str(tmp_path / "p"))
    assert not (tmp_path / "p").exists() and not capture.active  # configuring starts nothing
    f = jax.jit(lambda x: x * 2)
    with capture, jax.profiler.StepTraceAnnotation("train", step_num=7):
        f(np.ones(4)).block_until_ready()
    assert not capture.active
    assert trace_steps(tmp_path / "p") == [7]
    with pytest.raises(RuntimeError, match="not capturing"):
        capture.stop()


def test_evaluate_runs_a_finite_prefix_with_per_batch_keys():
    objective, spec, state, step, batches = regression_run()
    state, _ = step(state, batches[0])
    eval_fn = jax.jit(make_eval(objective, spec))
    rng = jax.random.PRNGKey(3)
    short = evaluate(eval_fn, state, iter(batches[:3]), 5, rng)  # the data ends before 5
    assert short["num_batches"] == 3
    manual = [float(eval_fn(state, b, jax.random.fold_in(rng, i))["loss"]) for i, b in enumerate(batches[:3])]
    assert short["loss"] == pytest.approx(np.mean(manual), rel=1e-6)
    endless = evaluate(eval_fn, state, iter(lambda: batches[0], None), 2, rng)
    assert endless["num_batches"] == 2
    with pytest.raises(ValueError, match="evaluation data is empty"):
        evaluate(eval_fn, state, iter([]), 2, rng)


def test_evaluation_bounds_its_hosted_previews():
    images = np.zeros((10, 8, 8, 1), np.float32)  # 256 bytes each
    capped = Evaluation.hosted(5, {"loss": 1.0}, {"samples": ImageGrid(images, columns=5)}, max_images=4)
    assert len(capped.previews["samples"].images) == 4 and capped.dropped == 6
    by_bytes = Evaluation.hosted(5, {}, {"a": ImageGrid(images), "b": ImageGrid(images)}, max_bytes=600)
    assert len(by_bytes.previews["a"].images) == 2 and "b" not in by_bytes.previews
    assert by_bytes.dropped == 18


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_updating_line_on_a_terminal_and_summaries_elsewhere():
    tty = Terminal()
    progress = Progress(100, batch_size=32, stream=tty)
    for step in (10, 20, 30):
        progress.update(step, 0.5)
    progress.close()
    text = tty.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, rewritten in place
    assert text.count("\r") == 2
    last = text.rstrip().split("\r")[-1]
    assert (
        "step 30/100" in last
        and "steps/s" in last
        and "ex/s" in last
        and "ETA" in last
        and "loss 0.5" in last
    )

    log = io.StringIO()
    quiet = Progress(100, batch_size=32, stream=log, summary_every=3600.0)
    for step in range(10, 101, 10):
        quiet.update(step, 0.25)
    quiet.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step 100/100")  # only the final summary
