"""The side-effect stages ``fit`` calls: metrics, evaluation, previews, checkpoints, progress.

Evaluation and previews have cadences of their own (``eval.every``, ``preview.every``).

Each stage touches the host only when due; between cadences the loop never waits on the device.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import jax

from dew.averaging.averager import Averages
from dew.averaging.power_ema import PowerEMA, PowerEMASnapshots
from dew.checkpointing.checkpoints import Checkpoints
from dew.contracts.objective import Objective, check_artifact
from dew.contracts.state import TrainState, num_updates
from dew.data.dataset import Dataset
from dew.tracking.console import Progress
from dew.tracking.media import artifact_files, write_atomically
from dew.tracking.trackers import LoggingCategory, Tracker
from dew.training.evaluation import Evaluation, evaluate
from dew.training.metrics import DeviceSums
from dew.training.names import EVAL_LOSS, LOSS, LOSS_SCALE_OVERFLOWS, NONFINITE_FLAG
from dew.training.stage import Stage, StepContext, next_multiple

#: Step statistics that are counts: summed over a logging window, not averaged.
COUNTED = frozenset({NONFINITE_FLAG, LOSS_SCALE_OVERFLOWS})


class MetricsStage(Stage):
    """Averages the step statistics over each window of ``every`` steps and logs them; counts
    (``skipped_updates``: non-finite updates dropped) are summed over the window instead. The
    sums are kept on the device and fetched once per window, in one transfer.

    A window this stage saw only part of (the run resumed from a step inside it, or stopped
    early) is marked: its row carries ``window_steps``, the number of steps it averages. Rows of
    whole windows carry no such key, so a resumed run's history reads like a straight run's."""

    def __init__(self, tracker: Tracker, every: int, batch_size: int, progress: Progress | None = None):
        self.tracker, self.every, self.batch_size, self.progress = tracker, every, batch_size, progress
        self._sums = DeviceSums()
        # Throughput is timed from the loop's start (so the first window includes the compile),
        # and every window gets a system row, the first after a resume too: the rows a resumed
        # run writes are the rows a straight run writes.
        self._since = time.perf_counter()
        self._since_step: int | None = None

    def observe(self, ctx: StepContext) -> None:
        if self._since_step is None:
            self._since_step = ctx.step - ctx.steps
        self._sums.add(ctx.stats, stacked=ctx.steps > 1)

    def run(self, ctx: StepContext) -> None:
        means, count = self._sums.means(COUNTED)
        if not count:
            return
        whole = ctx.step - (ctx.step - 1) // self.every * self.every  # steps since the last boundary
        if count < whole:
            means["window_steps"] = float(count)
        self.tracker.log(LoggingCategory.TRAIN_METRICS, means, ctx.step)
        now = time.perf_counter()
        assert self._since_step is not None, "observe runs before run at every step"
        rate = (ctx.step - self._since_step) / max(now - self._since, 1e-9)
        system = {"steps_per_sec": rate, "examples_per_sec": rate * self.batch_size}
        self.tracker.log(LoggingCategory.SYSTEM_METRICS, system, ctx.step)
        self._since, self._since_step = now, ctx.step
        if self.progress is not None:
            self.progress.update(ctx.step, means.get(LOSS))

    def stop_early(self, ctx: StepContext) -> None:
        """Log the window so far, including the step the loop stopped at (not yet observed)."""
        self.observe(ctx)
        self.run(ctx)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()


class EvalStage(Stage):
    """Validation statistics on a fixed prefix of the validation data, with the debiased EMA.

    The same batches and the same key every time, so successive numbers are comparable
    (``evaluate``: batch i gets ``fold_in(key, i)``). The mean loss is reported as ``eval_loss``
    for the checkpoint stage to rank by. With a ``progress`` display each evaluation is also one
    console line (``step <n>/<total>  eval  loss ...``).
    """

    def __init__(
        self,
        eval_fn: Callable[..., dict[str, jax.Array]],
        batches: Sequence[dict[str, Any]],
        tracker: Tracker,
        every: int,
        seed: int = 0,
        place_batch: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
        progress: Progress | None = None,
    ):
        self.eval_fn, self.batches, self.tracker, self.every = eval_fn, batches, tracker, every
        self.place_batch, self.progress = place_batch, progress
        self.rng = jax.random.PRNGKey(seed)

    def run(self, ctx: StepContext) -> None:
        means = evaluate(
            self.eval_fn, ctx.state, self.batches, len(self.batches), self.rng, place_batch=self.place_batch
        )
        means.pop("num_batches")
        Evaluation.hosted(ctx.step, means).log(self.tracker)
        ctx.reports[EVAL_LOSS] = means[LOSS]
        if self.progress is not None:
            self.progress.report(ctx.step, "eval", means)


class PreviewStage(Stage):
    """The objective's preview of the debiased EMA, scored by ``metrics`` and logged as one
    bounded ``Evaluation`` event; each artifact is also written under ``directory`` on rank zero
    as the files ``tracking.media.artifact_files`` names (an ``ImageGrid`` as PNG, a
    ``VideoGrid`` as GIF, ``TextSamples`` as text and HTML, ``TokenScores`` as heat-coloured
    HTML and PNG, ``Representations`` as a PCA scatter PNG and an ``.npz``), once per step
    (``<name>_<step>.<ext>``) and as the latest (``<name>.<ext>``, e.g. ``samples.png``).

    ``params_fn(state)`` gives the parameters to preview (the Trainer's jitted debiased EMA,
    replicated); ``objective.preview(params, rng)`` runs on every process (it may be collective)
    and returns one artifact (logged as ``samples``) or a mapping name -> artifact;
    ``objective.score(preview, metrics)`` turns what it returned into scalars. A fixed key means
    successive previews show the same noise, so change over training is visible. With a
    ``progress`` display each preview is also one console line: its scores and, on rank zero,
    the step's main file (``step <n>/<total>  preview  <metric> <value> ...  <file>``).
    """

    def __init__(
        self,
        objective: Objective,
        params_fn: Callable[[TrainState], Any],
        directory: str,
        tracker: Tracker,
        every: int,
        metrics: dict[str, Callable[..., float]] | None = None,
        seed: int = 0,
        progress: Progress | None = None,
    ):
        self.objective, self.params_fn, self.directory, self.tracker = (
            objective,
            params_fn,
            directory,
            tracker,
        )
        self.every, self.metrics = every, metrics or {}
        self.rng = jax.random.PRNGKey(seed)
        self.latest_path: str | None = None
        self.progress = progress

    def run(self, ctx: StepContext) -> None:
        # One artifact, or (an objective showing several) a mapping of names to artifacts.
        preview: object = self.objective.preview(self.params_fn(ctx.state), self.rng)
        named = (
            cast("Mapping[str, object]", preview) if isinstance(preview, Mapping) else {"samples": preview}
        )
        artifacts = {name: check_artifact(a, self.objective) for name, a in named.items()}
        scores = self.objective.score(preview, self.metrics)
        event = Evaluation.hosted(ctx.step, scores, artifacts)
        shown_at: str | None = None  # this step's main file, where this process wrote one
        for name, shown in event.previews.items():
            for stem in (f"{name}_{ctx.step:08d}", name):
                written = [
                    write_atomically(os.path.join(self.directory, file_name), data)
                    for _, file_name, data in artifact_files(stem, shown)
                ]
                if name == "samples" and stem != name and written:
                    self.latest_path = shown_at = written[0]  # this step's main file (PNG, GIF or text)
        event.log(self.tracker)
        ctx.reports.update(scores)
        if self.progress is not None:
            self.progress.report(ctx.step, "preview", event.metrics, note=shown_at or "")


class CheckpointStage(Stage):
    """Saves the state and the data position, asynchronously, with the most recent value of each
    metric reported in this fit (``ctx.reports``, ``eval_loss`` as ``loss``; the checkpoints rank
    by their ``best_metric``, and a save before it was ever reported cannot become the best): to
    the persistent directory every ``every`` steps (and at the end), and to each process's local
    directory every ``checkpoints.local_every`` steps in between.
    ``close`` waits, so a finished ``fit`` has everything on disk and a failed write stops it.

    With a ``tracker``, a save whose ranked metric beats every earlier one (this run's and, on a
    resume, the best already on disk) is reported under ``LoggingCategory.BEST_MODEL`` and, with a
    ``progress`` display, as one console line (``step <n>/<total>  best checkpoint  eval_loss ...
    <path>``)."""

    def __init__(
        self,
        checkpoints: Checkpoints,
        dataset: Dataset,
        every: int,
        tracker: Tracker | None = None,
        progress: Progress | None = None,
    ):
        self.checkpoints, self.dataset, self.every, self.tracker = checkpoints, dataset, every, tracker
        self.progress = progress
        self._best_loss: float | None = None
        self._latest: dict[str, float] = {}

    def observe(self, ctx: StepContext) -> None:
        # stages before this one ran already this step
        self._latest.update({(LOSS if k == EVAL_LOSS else k): float(v) for k, v in ctx.reports.items()})

    def _local_due(self, ctx: StepContext) -> bool:
        local_every = self.checkpoints.local_every
        return bool(local_every) and ctx.step % local_every == 0

    def due(self, ctx: StepContext) -> bool:
        return super().due(ctx) or self._local_due(ctx)

    def next_due(self, step: int) -> int | None:
        points = (super().next_due(step), next_multiple(step, self.checkpoints.local_every or 0))
        return min((p for p in points if p is not None), default=None)

    def run(self, ctx: StepContext) -> None:
        position, share = self.dataset.save_position(), self.dataset.share
        if super().due(ctx):
            # The latest value of everything reported so far in this fit (the evaluation loss as
            # "loss"); the checkpoints rank by the metric they were configured with, and a save
            # without it is never the best.
            metrics = dict(self._latest) or None
            metric = self.checkpoints.best_metric
            if metrics is not None and metric in metrics and self.tracker is not None:
                # Reported before the save: a kill just after the step lands keeps its row, and
                # one before leaves a row past the step a restart resumes from, which the
                # restart's cleanup (CLEANUP_AFTER_CKPT_RESTORATION) drops with the rest.
                self._report_if_best(ctx.step, metrics[metric])
            self.checkpoints.save(ctx.step, ctx.state, position, metrics, share=share)
        else:
            self.checkpoints.save_local(ctx.step, ctx.state, position, share=share)

    def _report_if_best(self, step: int, loss: float) -> None:
        if self._best_loss is None:  # once per fit: the best a resumed run already has on disk
            previous = self.checkpoints.best_step()
            metrics = None if previous is None or previous == step else self.checkpoints.metrics(previous)
            self._best_loss = float(metrics[self.checkpoints.best_metric]) if metrics else float("inf")
        if loss < self._best_loss:
            self._best_loss = loss
            name = EVAL_LOSS if self.checkpoints.best_metric == LOSS else self.checkpoints.best_metric
            assert self.tracker is not None, "run reports a best checkpoint only with a tracker"
            self.tracker.log(LoggingCategory.BEST_MODEL, {name: loss, "step": step}, step)
            if self.progress is not None:
                self.progress.report(step, "best checkpoint", {name: loss}, note=self.checkpoints.path(step))

    def stop_early(self, ctx: StepContext) -> None:
        """Save the state the loop stopped with (persistently, unranked) and wait for it."""
        if ctx.step not in self.checkpoints.all_steps():
            position, share = self.dataset.save_position(), self.dataset.share
            self.checkpoints.save(ctx.step, ctx.state, position, None, share=share)
        self.checkpoints.wait()

    def close(self) -> None:
        self.checkpoints.wait()


class SnapshotStage(Stage):
    """Saves the averages that keep snapshots (``Averages.power``, EDM2's post-hoc EMA) every
    ``snapshot_every`` train steps (and at the end): what ``read`` gives of each, by name."""

    def __init__(self, store: PowerEMASnapshots, averages: Averages, accumulation: int = 1):
        if averages.power is None:
            raise ValueError(
                "SnapshotStage: the averages keep no power EMA (config.ema.power_std_rels is ())"
            )
        self.store, self.averages, self.accumulation = store, averages, accumulation
        self.power: PowerEMA = averages.power
        self.every = averages.power.snapshot_every

    def run(self, ctx: StepContext) -> None:
        updates = int(num_updates(ctx.step, self.accumulation))
        if updates < 1 or ctx.step in self.store.steps():
            return
        power = self.power
        slots = [tree for tree, _ in power.read(getattr(ctx.state, power.field), updates)]
        self.store.save(ctx.step, updates, power, slots)

    def close(self) -> None:
        self.store.close()
