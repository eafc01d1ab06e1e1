"""``Trainer``: the pure stages and the side-effect stages, built from one config and run by
``fit``. Everything it builds is an ordinary object a user can build and call by hand."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from dew import registry
from dew.config import ConfigError
from dew.data.dataset import DataPartition, Dataset
from dew.objectives.base import EMASpec, Objective
from dew.training import ema as ema_lib
from dew.training.checkpoint_config import checkpoint_settings
from dew.training.checkpoints import (
    CheckpointRestorationError,
    Checkpoints,
    read_run_metadata,
    save_run_metadata,
)
from dew.training.console import Progress
from dew.training.loop import Stage, fit
from dew.training.power_ema import SNAPSHOT_DIR, PowerEMA, PowerEMASnapshots, SnapshotStage
from dew.training.profile import ProfileWindow
from dew.training.sharding import Layout, MeshSpec
from dew.training.stages import CheckpointStage, EvalStage, MetricsStage, PreviewStage
from dew.training.state import TrainState, num_updates
from dew.training.steps import NONFINITE_POLICIES, abstract_state, make_eval, make_init, make_step
from dew.training.trackers import (
    LoggingCategory,
    Tracker,
    Trackers,
    make_trackers,
    validate_tracking,
)


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
    checkpoint_settings(c.checkpoint)
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
    interval = tuple(_get(c, "sampling.guidance_interval", ()))
    _require(
        interval == () or (len(interval) == 2 and 0 <= interval[0] < interval[1]),
        "sampling.guidance_interval",
        interval,
        "() for the whole σ range, or (sigma_lo, sigma_hi) with 0 <= sigma_lo < sigma_hi",
    )
    _require(
        0.0 <= c.objective.condition_dropout < 1.0,
        "objective.condition_dropout",
        c.objective.condition_dropout,
        "a float in [0, 1)",
    )
    try:
        validate_tracking(c.tracking)
    except ValueError as e:
        raise ConfigError(str(e)) from e
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
    validate_trainer_config(c)


# --- the trainer's own knobs: mesh, accumulation, EMA warm-up, non-finite policy, profiling -------
def _get(config: ml_collections.ConfigDict, key: str, default: Any) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return default
        node = node[part]
    return node


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_trainer_config(c: ml_collections.ConfigDict) -> None:
    """The optional sections (absent keys take the defaults experiments/edm.py documents)."""
    for axis in ("model", "fsdp"):
        size = _get(c, f"mesh.{axis}", 1)
        _require(_is_int(size) and size >= 1, f"mesh.{axis}", size, "an int >= 1 (devices on that axis)")
    devices = _get(c, "mesh.devices", 0)
    _require(_is_int(devices) and devices >= 0, "mesh.devices", devices, "an int >= 0 (0: all devices)")
    k = _get(c, "train.accumulation", 1)
    _require(_is_int(k) and k >= 1, "train.accumulation", k, "an int >= 1 (micro-batches per update)")
    policy = _get(c, "train.nonfinite", "stop")
    _require(policy in NONFINITE_POLICIES, "train.nonfinite", policy, f"one of {NONFINITE_POLICIES}")
    half_life = _get(c, "ema.half_life", 0.0)
    _require(half_life >= 0, "ema.half_life", half_life, "a float >= 0 (updates; 0: use ema.decay)")
    ramp_up = _get(c, "ema.ramp_up", 0.0)
    _require(ramp_up >= 0, "ema.ramp_up", ramp_up, "a float >= 0 (0: no ramp-up)")
    _require(not (ramp_up and not half_life), "ema.ramp_up", ramp_up, "0 unless ema.half_life is set")
    try:
        power_ema_from_config(c)
    except ValueError as e:
        raise ConfigError(f"config.ema.power_sigma_rels / config.ema.snapshot_every: {e}") from e
    tracks = _get(c, "ema.tracks", "")
    try:
        re.compile(tracks)
    except (re.error, TypeError) as e:
        raise ConfigError(
            f"config.ema.tracks={tracks!r} is invalid: expected a regular expression ({e})"
        ) from e
    for key, low in (("profile.steps", 0), ("profile.warmup", 1)):
        value = _get(c, key, low)
        _require(_is_int(value) and value >= low, key, value, f"an int >= {low}")


def ema_spec_from_config(c: ml_collections.ConfigDict) -> EMASpec:
    """``config.ema``: decay, or EDM's half-life (+ ramp-up) in updates; ``tracks`` a regex
    searched in each parameter path ("" tracks every leaf)."""
    tracks = _get(c, "ema.tracks", "")
    pattern = re.compile(tracks) if tracks else None
    half_life = _get(c, "ema.half_life", 0.0) or None
    return EMASpec(
        decay=c.ema.decay,
        tracks=None if pattern is None else (lambda path: pattern.search(path) is not None),
        half_life=half_life,
        ramp_up=(_get(c, "ema.ramp_up", 0.0) or None) if half_life else None,
    )


def power_ema_from_config(c: ml_collections.ConfigDict) -> PowerEMA | None:
    """``config.ema.power_sigma_rels`` (post-hoc EMA profiles; () = off) and
    ``config.ema.snapshot_every`` (train steps; 0 = every ``checkpoint.every``)."""
    sigma_rels = tuple(_get(c, "ema.power_sigma_rels", ()))
    if not sigma_rels:
        return None
    every = _get(c, "ema.snapshot_every", 0) or c.checkpoint.every
    return PowerEMA(sigma_rels, every)


def mesh_spec_from_config(c: ml_collections.ConfigDict) -> MeshSpec:
    """``config.mesh``: devices per sharding axis (model, fsdp); data parallelism fills the rest."""
    axes = {axis: _get(c, f"mesh.{axis}", 1) for axis in ("fsdp", "model")}
    return MeshSpec({k: v for k, v in axes.items() if v > 1}, devices=_get(c, "mesh.devices", 0) or None)


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
        # The mesh and the batch split are checked first: bad input fails before any work.
        try:
            self.mesh = mesh_spec_from_config(c).mesh()
            self.layout = Layout.for_mesh(self.mesh)
            self.layout.check_batch(c.dataset.batch_size, "config.dataset.batch_size")
        except ValueError as e:
            raise ConfigError(f"config.mesh / config.dataset.batch_size: {e}") from e
        share = DataPartition(jax.process_index(), jax.process_count())
        if c.dataset.batch_size % share.count:
            raise ConfigError(
                f"config.dataset.batch_size={c.dataset.batch_size} is invalid: expected a multiple of the "
                f"{share.count} processes (each reads an equal share)"
            )
        local_batch = c.dataset.batch_size // share.count
        # Keys of config.dataset beyond name/batch_size are the source's options (resolution, ...).
        options = {k: v for k, v in c.dataset.items() if k not in ("name", "batch_size")}
        self.train_source = registry.datasets[c.dataset.name]("train", **options)
        self.val_source = registry.datasets[c.dataset.name]("validation", **options)
        self.train_data = Dataset(self.train_source, local_batch, seed=c.seed, share=share)
        self.val_data = Dataset(self.val_source, local_batch, seed=c.seed, shuffle=False, share=share)
        self.objective: Objective = registry.objectives[c.objective.name].from_config(c, self.train_source)
        self.optimizer = make_optimizer(c)
        self.ema = ema_spec_from_config(c)
        self.accumulation = _get(c, "train.accumulation", 1)
        self.power_ema = power_ema_from_config(c)
        init = make_init(
            self.objective, self.optimizer, self.ema, accumulation=self.accumulation, power_ema=self.power_ema
        )
        abstract = abstract_state(init, self.example_batch())
        try:
            self.ema.check(abstract.params)
        except ValueError as e:
            raise ConfigError(f"config.ema.tracks={_get(c, 'ema.tracks', '')!r}: {e}") from e
        self.state_shardings = self.layout.state_shardings(abstract)
        self.init = self.layout.jit_init(init, abstract)
        self._step = self.layout.jit_step(
            make_step(
                self.objective,
                self.optimizer,
                self.ema,
                accumulation=self.accumulation,
                power_ema=self.power_ema,
            ),
            abstract,
        )
        self.eval = jax.jit(
            make_eval(self.objective, self.ema, accumulation=self.accumulation),
            in_shardings=(self.state_shardings, self.layout.batch_sharding, self.layout.replicated),
            out_shardings=self.layout.replicated,
        )
        self.checkpoint_settings = cs = checkpoint_settings(c.checkpoint)
        self.checkpoints = Checkpoints(
            os.path.join(self.workdir, "checkpoints"),
            keep=cs.keep,
            keep_best=cs.keep_best,
            asynchronous=cs.asynchronous,
            local_directory=cs.local_directory,
            local_every=cs.local_every,
        )
        self.extra_trackers = trackers or []
        self.val_data.first(c.eval.num_batches)  # fail now, not at the first evaluation

    # --- pieces -----------------------------------------------------------------------------------
    def step(
        self, state: TrainState, batch: dict[str, np.ndarray]
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """The jitted, sharded train step on this process's share of a batch (placed on the
        mesh's batch axes first). ``state`` is donated: use the returned one."""
        return self._step(state, self.layout.place_batch(batch))

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
            self.objective.preview,
            per_class=s.per_class,
            steps=s.steps,
            solver=s.solver,
            guidance=s.guidance,
            guidance_interval=tuple(_get(self.config, "sampling.guidance_interval", ())),
        )

        def sample(state: TrainState, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
            return preview(
                ema_lib.debias(state.ema, self.ema, num_updates(state.step, self.accumulation)), rng
            )

        return jax.jit(sample, out_shardings=self.layout.replicated)

    def initial_state(self) -> TrainState:
        """The state the run starts from, as ``config.checkpoint`` asks.

        With ``restore_checkpoint_if_exists`` (the default) or ``step_to_restore``: the latest
        (or that) checkpoint of this run, or of ``restore_dir`` while this run has none yet,
        with its data position; ``restore_optimizer_state`` / ``restore_rng_key`` set to False
        keep the fresh state's values. ``clear_previous_checkpoints`` deletes this run's
        checkpoints first. A run that does not restore refuses a directory that holds checkpoints.
        """
        s = self.checkpoint_settings
        if s.clear_previous_checkpoints:
            self.checkpoints.clear()

        def fresh() -> TrainState:
            return self.init(jax.random.PRNGKey(self.config.seed), self.example_batch())

        if not s.restores:
            if self.checkpoints.latest is not None:
                raise CheckpointRestorationError(
                    f"{self.checkpoints.directory} already holds checkpoints (latest step "
                    f"{self.checkpoints.latest}) and config.checkpoint.restore_checkpoint_if_exists=False: "
                    "set clear_previous_checkpoints=True to start over, or choose another --workdir"
                )
            return fresh()
        source = self.checkpoints
        if s.restore_dir is not None and self.checkpoints.latest is None:
            source = Checkpoints(s.restore_dir, read_only=True)
        if s.step_to_restore is None and source.latest is None:
            return fresh()
        share = self.train_data.share
        if s.restore_optimizer_state and s.restore_rng_key:
            template = abstract_state(self.init, self.example_batch())
            state, position = source.restore(template, s.step_to_restore, share=share)
        else:
            state, position = source.resume(
                fresh(),
                s.step_to_restore,
                share=share,
                restore_optimizer_state=s.restore_optimizer_state,
                restore_rng_key=s.restore_rng_key,
            )
        if position is not None:
            self.train_data.read_position(position)
        return state

    def tracker(self) -> Trackers:
        """The configured trackers under ``workdir/tracking``, plus any passed in. On a resume
        they are first told which step was restored (``CLEANUP_AFTER_CKPT_RESTORATION``), so
        what an interrupted run logged after its checkpoint is discarded or marked."""
        built = make_trackers(
            self.config.tracking,
            os.path.join(self.workdir, "tracking"),
            config=self.config.to_dict(),
            run_name=os.path.basename(self.workdir),
        )
        trackers = Trackers([*built.sinks, *self.extra_trackers])
        if self.checkpoints.latest is not None:
            trackers.log(LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION, {}, self.checkpoints.latest)
        return trackers

    def stages(self, tracker: Tracker) -> list[Stage]:
        c = self.config
        metrics = {name: registry.metrics[name] for name in c.eval.metrics}
        progress = Progress(c.train.num_steps, c.dataset.batch_size)
        stages: list[Stage] = [MetricsStage(tracker, c.train.log_every, c.dataset.batch_size, progress)]
        if c.eval.every:
            stages.append(
                EvalStage(
                    self.eval,
                    self.val_data.first(c.eval.num_batches),
                    tracker,
                    c.eval.every,
                    seed=c.seed,
                    place_batch=self.layout.place_batch,
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
        stages.append(CheckpointStage(self.checkpoints, self.train_data, c.checkpoint.every, tracker))
        if self.power_ema is not None:
            stages.append(SnapshotStage(self.power_ema_snapshots(), self.power_ema, self.accumulation))
        profile_steps = _get(c, "profile.steps", 0)
        if profile_steps:
            directory = _get(c, "profile.directory", "") or os.path.join(self.workdir, "profile")
            stages.append(ProfileWindow(profile_steps, directory, warmup=_get(c, "profile.warmup", 5)))
        return stages

    def power_ema_snapshots(self) -> PowerEMASnapshots:
        """The run's post-hoc EMA snapshot store, ``<workdir>/power_ema``."""
        return PowerEMASnapshots(os.path.join(self.workdir, SNAPSHOT_DIR))

    def last_good_checkpoint(self) -> str | None:
        """The newest saved checkpoint's path (named when a non-finite step stops the run)."""
        latest = self.checkpoints.latest
        return None if latest is None else self.checkpoints.path(latest)

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
        if self.power_ema is not None:  # snapshots newer than the restored state are redone
            store = self.power_ema_snapshots()
            store.discard_after(start)
            store.close()
        tracker = self.tracker()
        try:
            state = fit(
                state,
                self.step,
                iter(self.train_data),
                self.config.train.num_steps,
                self.stages(tracker),
                nonfinite=_get(self.config, "train.nonfinite", "stop"),
                last_good=self.last_good_checkpoint,
            )
        finally:
            tracker.close()
        return state


def debiased_ema(state: TrainState, decay: float | EMASpec, accumulation: int = 1) -> Any:
    """The EMA parameters a user samples or exports with (``decay``: the run's EMASpec or β)."""
    return ema_lib.debias(state.ema, decay, num_updates(int(jax.device_get(state.step)), accumulation))


__all__ = ["Trainer", "check_workdir", "debiased_ema", "make_optimizer", "validate_config"]
