"""``Trainer``: the pure stages and the side-effect stages, built from one config and run by
``fit``. Everything it builds is an ordinary object a user can build and call by hand."""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from dew import registry
from dew.averaging.averager import Averages
from dew.averaging.power_ema import SNAPSHOT_DIR, PowerEMASnapshots
from dew.checkpointing.checkpoints import Checkpoints
from dew.checkpointing.restore import RestorePolicy
from dew.checkpointing.settings import checkpoint_settings
from dew.contracts.objective import Objective
from dew.contracts.state import TrainState
from dew.run_records import record_start
from dew.runtime import heartbeats
from dew.runtime.platform import Platform
from dew.runtime.precompile import BackgroundCompile
from dew.schema import ConfigError
from dew.tracking.console import Progress
from dew.tracking.trackers import LoggingCategory, Tracker, Trackers, make_trackers
from dew.training import typed_jax
from dew.training.build import build_objective, check_cadences, mesh_and_data, open_split
from dew.training.host_init import builds_on_host
from dew.training.learning_rate import make_optimizer
from dew.training.loop import Stage, fit
from dew.training.nonfinite import NonFiniteGuard
from dew.training.parameter_table import report_parameters
from dew.training.precision import from_config as precision_from_config
from dew.training.preemption import PreemptionStage
from dew.training.profile import ProfileWindow
from dew.training.programs import Programs, debiased_ema
from dew.training.stages import CheckpointStage, EvalStage, MetricsStage, PreviewStage, SnapshotStage
from dew.training.trainer_config import check_workdir, config_schema, platform_for, resolve_config


class Trainer:
    """Runs an Objective: gradients, EMA, checkpoints, logging, previews.

    Construction resolves the config against ``config_schema()`` (``self.config`` is the
    complete config), validates it and builds every piece but writes nothing, so a bad config
    or workdir fails before any file exists. ``run`` trains (resuming from the latest checkpoint
    in ``workdir`` if there is one) and returns the final state. The Trainer knows the
    ``Objective`` contract and nothing else about what is learned.

    ``platform``: what ``dew.runtime.start`` set up for this config and workdir, from a caller
    that started the platform itself (the step to restore is then checked again here). Left
    None, a Trainer built in a user's own code checks the workdir and starts the platform here
    (``trainer_config.platform_for``: the same decision and ``kernel choice:`` line, keeping the
    kernels a resumed run recorded). Either way ``self.platform`` is
    that one value (None only where JAX started first without ``dew.runtime.start``: one
    ``PlatformNotApplied`` warning at the line that built the Trainer). ``for_run`` is the
    constructor for a caller that resolved, checked and started all of it once already
    (``dew.launch.Run``, behind ``python -m dew.main``)."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        workdir: str,
        trackers: list[Tracker] | None = None,
        *,
        resolved: bool = False,
        platform: Platform | None = None,
    ):
        c = config if resolved else resolve_config(config)
        workdir, platform = platform_for(c, workdir, platform)  # started here if not given
        self._build(c, workdir, platform, trackers or [])

    @classmethod
    def for_run(
        cls,
        config: ml_collections.ConfigDict,
        workdir: str,
        platform: Platform,
        trackers: list[Tracker] | None = None,
    ) -> Trainer:
        """The Trainer of a run whose caller did what ``__init__`` does before building:
        ``config`` resolved, ``workdir`` checked with it (``check_workdir(workdir, config)``, which
        returns the absolute path) and ``platform`` started for both (``dew.launch.Run``, behind
        ``python -m dew.main``). Builds the same pieces and writes nothing."""
        trainer = cls.__new__(cls)
        trainer._build(config, workdir, platform, trackers or [])
        return trainer

    def _build(
        self, c: ml_collections.ConfigDict, workdir: str, platform: Platform | None, trackers: list[Tracker]
    ) -> None:
        """Every piece, from the resolved config ``c``, in the order bad input is found in."""
        self.config, self.workdir, self.platform, self.extra_trackers = c, workdir, platform, trackers
        self.train_source, self.val_source = (
            open_split(c.dataset, "train"),
            open_split(c.dataset, "validation"),
        )
        self.objective: Objective = build_objective(c, self.train_source)
        # bad input fails before any work
        self.mesh, self.layout, self.train_data, self.val_data = mesh_and_data(
            c, self.train_source, self.val_source
        )
        self.precision = precision_from_config(c.precision)
        if c.precision.compute not in self.objective.precisions:
            raise ConfigError(
                f"config.precision.compute={c.precision.compute!r} is invalid for config.objective.name="
                f"{c.objective.name!r}: {type(self.objective).__name__} computes in "
                f"{self.objective.precisions}"
            )
        self.optimizer = make_optimizer(c)
        self.averages = Averages.from_config(c)  # the classic EMA and, when configured, the power EMA
        self.accumulation = c.train.accumulation
        example = self.example_batch()
        try:
            self.programs = Programs(
                self.objective,
                self.optimizer,
                self.averages,
                self.layout,
                example,
                accumulation=self.accumulation,
                steps_per_call=c.train.steps_per_call,
                places_ahead=bool(self.train_data.prefetch) or jax.process_count() > 1,
                precision=self.precision,
                # "stop" ends the run at the first flagged step, before any stage could save
                # state from after it: the step need not keep the old state beside the new
                skip_nonfinite=c.train.nonfinite == "skip",
            )
        except (ValueError, TypeError) as e:  # e.g. a convolutional model given 2D points
            raise ConfigError(
                f"config.model (name={c.model.name!r}) / config.objective (name={c.objective.name!r}) cannot "
                f"build parameters for {self.train_source.name!r} batches: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}"
            ) from None
        try:
            self.averages.ema.law_spec.check(self.programs.abstract.params)
        except ValueError as e:
            raise ConfigError(f"config.ema.tracks={c.ema.tracks!r}: {e}") from e
        self.checkpoint_settings = cs = checkpoint_settings(c.checkpoint)
        # Every checkpoint records the EMA it holds, so restore_ema debiases it on its own.
        self.ema_record = self.averages.ema.record(self.programs.abstract.params, self.accumulation)
        self.checkpoints: Checkpoints | None = cs.checkpoints(self.workdir, ema=self.ema_record)  # None: off
        self.restore = RestorePolicy(self.checkpoints, cs, self.workdir, c.to_dict(), c.dataset.batch_size)
        check_cadences(c, self.objective)

    # --- pieces -----------------------------------------------------------------------------------
    def step(
        self, state: TrainState, batch: dict[str, np.ndarray]
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """The jitted, sharded train step on this process's share of a batch, placed as ``fit``
        places it (``Programs.place``). ``state`` is donated: use the returned one."""
        return self.programs.step(state, self.programs.place(batch))

    def example_batch(self) -> dict[str, np.ndarray]:
        """A batch of the training shapes (zeros): for init and templates, consumes no data."""
        return {
            k: np.zeros((self.config.dataset.batch_size, *v.shape[1:]), v.dtype)
            for k, v in self.train_source.fields.items()
        }

    def debiased_ema(self, state: TrainState) -> Any:
        """The EMA parameters this run evaluates, previews and exports: debiased with the run's
        ``EMASpec`` and accumulation (eagerly, on the host's arrays; ``preview_params`` is the
        jitted, replicated equivalent the stages use)."""
        return debiased_ema(state, self.averages.ema.law_spec, self.accumulation)

    def preview_params(self, state: TrainState) -> Any:
        """The debiased EMA, jitted and replicated on every device: what previews are drawn from."""
        return self.programs.debiased(state.ema, state.step)

    def fresh_state(self, *, beside_compile: bool = False) -> TrainState:
        """The state of step 0, from ``config.seed``: built on the devices or on the host's CPU as
        ``config.runtime.fresh_state`` says (``dew.training.host_init.builds_on_host``;
        ``beside_compile``: the step is compiling in a thread meanwhile)."""
        init = self.programs.init
        if builds_on_host(self.config.runtime.fresh_state, beside_compile=beside_compile):
            init = self.programs.host_init
        return init(jax.random.PRNGKey(self.config.seed), self.example_batch())

    def initial_state(self, *, beside_compile: bool = False) -> TrainState:
        """The state the run starts from, as ``config.checkpoint`` asks (``RestorePolicy``: the
        latest checkpoint of this run or of ``restore_dir`` with its data position, or fresh:
        ``fresh_state(beside_compile=...)``)."""
        fresh = functools.partial(self.fresh_state, beside_compile=beside_compile)
        state = self.restore.initial_state(fresh, self.programs.template, self.train_data)
        if self.restore.restored_step is None:
            return state
        # The EMA law this run's step applies (the checkpoint's, or none for one written before
        # states carried it): what its own saves then store beside the EMA.
        law = self.averages.ema.law(self.programs.abstract.params, self.accumulation)
        state = state.replace(ema_law=typed_jax.device_put(law, self.programs.state_shardings.ema_law))
        # A checkpoint written under another precision policy: this run's dynamic loss scale
        # starts afresh where the checkpoint has none, and one this run does not use is dropped.
        if self.programs.abstract.loss_scale is None:
            return state.replace(loss_scale=None)
        if state.loss_scale is None:
            scale = typed_jax.device_put(
                self.precision.init_state(), self.programs.state_shardings.loss_scale
            )
            state = state.replace(loss_scale=scale)
        return state

    @property
    def restored_step(self) -> int | None:
        """The step ``initial_state`` restored (None: a fresh start, or not called yet)."""
        return self.restore.restored_step

    def tracker(self, start: int | None = None) -> Trackers:
        """The configured trackers under ``workdir/tracking``, plus any passed in. When the run
        starts at step ``start`` (default: the restored step) and anything was tracked
        before, they are first told that step (``CLEANUP_AFTER_CKPT_RESTORATION``), so what an
        interrupted run logged after it (all of it, for a run killed before its first
        checkpoint) is discarded or marked."""
        built = make_trackers(
            self.config.tracking,
            os.path.join(self.workdir, "tracking"),
            config=self.config.to_dict(),
            run_name=os.path.basename(self.workdir),
        )
        trackers = Trackers([*built.sinks, *self.extra_trackers])
        if start is None:
            start = self.restored_step
        tracked_before = os.path.isdir(os.path.join(self.workdir, "tracking"))
        if start is not None and (start > 0 or tracked_before):
            trackers.log(LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION, {}, start)
        return trackers

    def stages(self, tracker: Tracker) -> list[Stage]:
        """The side-effect stages, in the order ``fit`` runs them each step: metrics, evaluation
        (``eval.every``; its loss ranks the checkpoint saved after it), previews
        (``preview.every``), checkpoints, power-EMA snapshots, profiling, and last the
        preemption stage (so the step's own stages, its periodic save, have run when a signal
        stops it)."""
        c = self.config
        progress = Progress(c.train.num_steps, c.dataset.batch_size)
        stages: list[Stage] = [MetricsStage(tracker, c.train.log_every, c.dataset.batch_size, progress)]
        if c.eval.every:
            batches = self.val_data.first(c.eval.num_batches)
            stages.append(
                EvalStage(
                    self.programs.eval,
                    batches,
                    tracker,
                    c.eval.every,
                    seed=c.seed,
                    place_batch=self.layout.place_batch,
                    progress=progress,
                )
            )
        if c.preview.every:
            metrics = {name: registry.metrics[name] for name in c.preview.metrics}
            previews = os.path.join(self.workdir, "previews")
            stages.append(
                PreviewStage(
                    self.objective,
                    self.preview_params,
                    previews,
                    tracker,
                    c.preview.every,
                    metrics=metrics,
                    seed=c.seed,
                    progress=progress,
                )
            )
        if self.checkpoints is not None:
            stages.append(
                CheckpointStage(self.checkpoints, self.train_data, c.checkpoint.every, tracker, progress)
            )
        if self.averages.power is not None:
            stages.append(SnapshotStage(self.power_ema_snapshots(), self.averages, self.accumulation))
        if c.profile.steps:
            directory = c.profile.directory or os.path.join(self.workdir, "profile")
            stages.append(ProfileWindow(c.profile.steps, directory, warmup=c.profile.warmup))
        stages.append(PreemptionStage(self.checkpoints, self.train_data))
        return stages

    def guard(self) -> NonFiniteGuard:
        """The non-finite policy ``config.train`` asks for (``nonfinite``, ``max_skipped`` over
        windows of ``log_every`` steps), naming the newest checkpoint when it stops the run."""
        t = self.config.train
        return NonFiniteGuard(
            t.nonfinite, last_good=self.last_good_checkpoint, max_skipped=t.max_skipped, window=t.log_every
        )

    def power_ema_snapshots(self) -> PowerEMASnapshots:
        """The run's post-hoc EMA snapshot store, ``<workdir>/power_ema``."""
        return PowerEMASnapshots(os.path.join(self.workdir, SNAPSHOT_DIR))

    def last_good_checkpoint(self) -> str | None:
        """The newest saved checkpoint's path (named when a non-finite step stops the run)."""
        if self.checkpoints is None:
            return None
        latest = self.checkpoints.latest_step()
        return None if latest is None else self.checkpoints.path(latest)

    # --- the run ----------------------------------------------------------------------------------
    def check_resumable(self) -> None:
        """Bad input a resume would only find later, checked before anything is written:
        ``num_steps`` below the step to resume from (``ResumeMismatchError``)."""
        self.restore.check_resumable(self.config.train.num_steps)

    def compile_step_in_background(self) -> BackgroundCompile:
        """Start compiling the program the run's first call runs, in a thread
        (``Programs.compile_in_background``); ``wait()`` before the first call."""
        return self.programs.compile_in_background()

    def run(self) -> TrainState:
        """Train from ``initial_state`` to ``config.train.num_steps`` with ``fit`` and the
        configured stages; return the final state. ``check_resumable`` first, then ``train``."""
        self.check_resumable()
        return self.train()

    def train(self) -> TrainState:
        """``run`` without its ``check_resumable``, for a caller that made that check once already,
        before side effects of its own (``dew.launch.Run``: the workdir lock comes first)."""
        os.makedirs(self.workdir, exist_ok=True)
        compiling = self.compile_step_in_background()  # overlaps the state's init or restore
        state = self.initial_state(beside_compile=True)
        start = int(jax.device_get(state.step))
        if start:
            assert self.checkpoints is not None  # a state past step 0 was restored from them
            print(f"resuming from step {start} ({self.checkpoints.source(start)})", flush=True)
        if self.averages.power is not None:  # snapshots newer than the restored state are redone
            store = self.power_ema_snapshots()
            store.discard_after(start)
            store.close()
        if jax.process_index() == 0:
            extra = {"ema": self.ema_record}
            kernels = None if self.platform is None else self.platform.kernels_record()
            if kernels is not None:  # what a resume keeps (dew.runtime.cpu.choice)
                extra["kernels"] = kernels
            record_start(
                self.workdir, self.config.to_dict(), start, processes=jax.process_count(), extra=extra
            )
            report_parameters(self.programs.abstract.params, self.workdir)  # clu's table, from shapes
        tracker = self.tracker(start)
        if self.programs.places_ahead:  # the data stream's thread places batches ahead of use
            self.train_data.set_placement(self.layout.place_batch)
        try:
            compiling.wait()
            # Every process has its step compiled before the first collective, which gloo gives
            # up on after 30 s: a peer still compiling on a loaded host would fail the run.
            heartbeats.barrier(f"dew-compiled-{start}", self.config.runtime.coordinator_timeout)
            calls = self.programs.calls()
            state = fit(
                state,
                calls,
                iter(self.train_data),
                self.config.train.num_steps,
                self.stages(tracker),
                guard=self.guard(),
            )
        finally:
            self.train_data.set_placement(None)
            tracker.close()
        return state


__all__ = ["Trainer", "check_workdir", "config_schema", "debiased_ema", "make_optimizer", "resolve_config"]
