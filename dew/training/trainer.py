"""``Trainer``: the pure stages and the side-effect stages, built from one config and run by
``fit``. Everything it builds is an ordinary object a user can build and call by hand."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from dew import registry
from dew.config import ConfigError
from dew.data.dataset import Dataset
from dew.objectives.base import EMASpec, Objective
from dew.training import ema as ema_lib
from dew.training.checkpoints import Checkpoints, read_run_metadata, save_run_metadata
from dew.training.console import Progress
from dew.training.loop import Stage, fit
from dew.training.stages import CheckpointStage, EvalStage, MetricsStage, PreviewStage
from dew.training.state import TrainState
from dew.training.steps import abstract_state, make_eval, make_init, make_step
from dew.training.trackers import LocalTracker, Tracker, Trackers

TRACKING_BACKENDS = ("local",)


def _require(ok: bool, key: str, value: Any, accepted: str) -> None:
    if not ok:
        raise ConfigError(f"config.{key}={value!r} is invalid: expected {accepted}")


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Check ranges and names before any work; every error names the key and what is accepted."""
    for key in (
        "dataset",
        "objective",
        "model",
        "optimizer",
        "ema",
        "train",
        "checkpoint",
        "eval",
        "sampling",
        "tracking",
    ):
        _require(key in config, key, None, "a section (see experiments/edm.py)")
    c = config
    _require(c.dataset.batch_size >= 1, "dataset.batch_size", c.dataset.batch_size, "an int >= 1")
    _require(c.train.num_steps >= 1, "train.num_steps", c.train.num_steps, "an int >= 1")
    _require(c.train.log_every >= 1, "train.log_every", c.train.log_every, "an int >= 1")
    _require(c.checkpoint.every >= 1, "checkpoint.every", c.checkpoint.every, "an int >= 1")
    _require(c.checkpoint.keep >= 1, "checkpoint.keep", c.checkpoint.keep, "an int >= 1")
    _require(c.eval.every >= 0, "eval.every", c.eval.every, "an int >= 0 (0 disables evaluation)")
    _require(c.eval.num_batches >= 1, "eval.num_batches", c.eval.num_batches, "an int >= 1")
    _require(
        c.optimizer.learning_rate > 0, "optimizer.learning_rate", c.optimizer.learning_rate, "a float > 0"
    )
    _require(c.optimizer.warmup_steps >= 0, "optimizer.warmup_steps", c.optimizer.warmup_steps, "an int >= 0")
    _require(
        c.optimizer.grad_clip >= 0, "optimizer.grad_clip", c.optimizer.grad_clip, "a float >= 0 (0: off)"
    )
    _require(0.0 <= c.ema.decay < 1.0, "ema.decay", c.ema.decay, "a float in [0, 1)")
    _require(c.sampling.steps >= 2, "sampling.steps", c.sampling.steps, "an int >= 2")
    _require(c.sampling.per_class >= 1, "sampling.per_class", c.sampling.per_class, "an int >= 1")
    _require(c.sampling.guidance >= 0, "sampling.guidance", c.sampling.guidance, "a float >= 0 (1: none)")
    _require(
        0.0 <= c.objective.condition_dropout < 1.0,
        "objective.condition_dropout",
        c.objective.condition_dropout,
        "a float in [0, 1)",
    )
    for backend in c.tracking.backends:
        _require(
            backend in TRACKING_BACKENDS,
            "tracking.backends",
            tuple(c.tracking.backends),
            f"a tuple drawn from {TRACKING_BACKENDS}",
        )
    for key, table in (
        ("dataset.name", registry.datasets),
        ("objective.name", registry.objectives),
        ("objective.preset", registry.presets),
        ("model.name", registry.models),
        ("sampling.solver", registry.samplers),
    ):
        section, field = key.split(".")
        name = c[section][field]
        if name not in table:
            raise ConfigError(f"config.{key}: {table._miss_message(name)}")
    for name in c.eval.metrics:
        if name not in registry.metrics:
            raise ConfigError(f"config.eval.metrics: {registry.metrics._miss_message(name)}")


def check_workdir(workdir: str) -> str:
    """The run's directory must be a directory (or not exist yet); nothing is created here."""
    path = os.path.abspath(workdir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--workdir={workdir!r} is a file; give a directory (new or a previous run's)")
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f"--workdir={workdir!r} lies under {parent!r}, which is a file")
    return path


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Adam with linear warm-up (EDM's lr ramp-up) and optional global-norm clipping."""
    o = config.optimizer
    schedule = (
        optax.linear_schedule(0.0, o.learning_rate, o.warmup_steps) if o.warmup_steps else o.learning_rate
    )
    adam = optax.adam(schedule, b1=o.b1, b2=o.b2)
    return optax.chain(optax.clip_by_global_norm(o.grad_clip), adam) if o.grad_clip > 0 else adam


class Trainer:
    """Runs an Objective: gradients, EMA, checkpoints, logging, previews.

    Construction validates the config and builds every piece but writes nothing, so a bad config
    or workdir fails before any file exists. ``run`` trains (resuming from the latest checkpoint
    in ``workdir`` if there is one) and returns the final state.
    """

    def __init__(
        self, config: ml_collections.ConfigDict, workdir: str, trackers: list[Tracker] | None = None
    ):
        validate_config(config)
        self.config = config
        self.workdir = check_workdir(workdir)
        c = config
        # Keys of config.dataset beyond name/batch_size are the source's options (resolution, ...).
        options = {k: v for k, v in c.dataset.items() if k not in ("name", "batch_size")}
        self.train_source = registry.datasets[c.dataset.name]("train", **options)
        self.val_source = registry.datasets[c.dataset.name]("validation", **options)
        self.train_data = Dataset(self.train_source, c.dataset.batch_size, seed=c.seed)
        self.val_data = Dataset(self.val_source, c.dataset.batch_size, seed=c.seed, shuffle=False)
        self.objective: Objective = registry.objectives[c.objective.name].from_config(c, self.train_source)
        self.optimizer = make_optimizer(c)
        self.ema = EMASpec(decay=c.ema.decay)
        self.init = jax.jit(make_init(self.objective, self.optimizer))
        self.step = jax.jit(make_step(self.objective, self.optimizer, self.ema), donate_argnums=0)
        self.eval = jax.jit(make_eval(self.objective, self.ema))
        self.checkpoints = Checkpoints(os.path.join(self.workdir, "checkpoints"), keep=c.checkpoint.keep)
        self.extra_trackers = trackers or []
        self.val_data.first(c.eval.num_batches)  # fail now, not at the first evaluation

    # --- pieces -----------------------------------------------------------------------------------
    def example_batch(self) -> dict[str, np.ndarray]:
        """A batch of the training shapes (zeros): for init and templates, consumes no data."""
        return {
            k: np.zeros((self.config.dataset.batch_size, *v.shape[1:]), v.dtype)
            for k, v in self.train_source.fields.items()
        }

    def sample_fn(self) -> Callable[[TrainState, jax.Array], tuple[jax.Array, jax.Array]]:
        """Jitted previews from the debiased EMA: one program for the whole sampler."""
        s = self.config.sampling
        preview = functools.partial(
            self.objective.preview, per_class=s.per_class, steps=s.steps, solver=s.solver, guidance=s.guidance
        )

        def sample(state: TrainState, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
            return preview(ema_lib.debias(state.ema, self.ema.decay, state.step), rng)

        return jax.jit(sample)

    def initial_state(self) -> TrainState:
        """The latest checkpoint's state (and data position) if there is one, else a fresh one."""
        if self.checkpoints.latest is not None:
            template = abstract_state(self.init, self.example_batch())
            state, position = self.checkpoints.restore(template, share=self.train_data.share)
            if position is not None:
                self.train_data.read_position(position)
            return state
        return self.init(jax.random.PRNGKey(self.config.seed), self.example_batch())

    def tracker(self) -> Trackers:
        sinks: list[Tracker] = [LocalTracker(os.path.join(self.workdir, "tracking"))]
        return Trackers([*sinks, *self.extra_trackers])

    def stages(self, tracker: Tracker) -> list[Stage]:
        c = self.config
        metrics = {name: registry.metrics[name] for name in c.eval.metrics}
        progress = Progress(c.train.num_steps, c.dataset.batch_size)
        stages: list[Stage] = [MetricsStage(tracker, c.train.log_every, c.dataset.batch_size, progress)]
        if c.eval.every:
            stages.append(
                EvalStage(
                    self.eval, self.val_data.first(c.eval.num_batches), tracker, c.eval.every, seed=c.seed
                )
            )
            stages.append(
                PreviewStage(
                    self.sample_fn(),
                    os.path.join(self.workdir, "previews"),
                    tracker,
                    c.eval.every,
                    columns=c.sampling.per_class,
                    metrics=metrics,
                    seed=c.seed,
                )
            )
        stages.append(CheckpointStage(self.checkpoints, self.train_data, c.checkpoint.every))
        return stages

    # --- the run ----------------------------------------------------------------------------------
    def run(self) -> TrainState:
        os.makedirs(self.workdir, exist_ok=True)
        if read_run_metadata(self.workdir) is None:
            save_run_metadata(
                self.workdir, {"config": self.config.to_dict(), "label": os.path.basename(self.workdir)}
            )
        state = self.initial_state()
        start = int(jax.device_get(state.step))
        if start:
            print(f"resuming from step {start} ({self.checkpoints.path(start)})", flush=True)
        tracker = self.tracker()
        try:
            state = fit(
                state, self.step, iter(self.train_data), self.config.train.num_steps, self.stages(tracker)
            )
        finally:
            tracker.close()
        return state


def debiased_ema(state: TrainState, decay: float) -> Any:
    """The EMA parameters a user samples or exports with."""
    return ema_lib.debias(state.ema, decay, int(jax.device_get(state.step)))


__all__ = ["Trainer", "check_workdir", "debiased_ema", "make_optimizer", "validate_config"]
