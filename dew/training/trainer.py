"""``Trainer``: the pure stages and the side-effect stages, built from one config and run by
``fit``. Everything it builds is an ordinary object a user can build and call by hand."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from dew import registry
from dew.data.dataset import DataPartition, Dataset
from dew.schema import ConfigError
from dew.training import ema as ema_lib
from dew.training import sharding
from dew.training.checkpointing.checkpoints import Checkpoints
from dew.training.checkpointing.errors import CheckpointDamagedError, CheckpointRestorationError, first_line
from dew.training.checkpointing.settings import checkpoint_settings
from dew.training.console import Progress
from dew.training.ema import EMASpec
from dew.training.loop import Stage, fit
from dew.training.objective import Objective
from dew.training.power_ema import SNAPSHOT_DIR, PowerEMASnapshots, SnapshotStage, power_ema_from_config
from dew.training.precompile import BackgroundCompile, abstract_like
from dew.training.preemption import PreemptionStage
from dew.training.profile import ProfileWindow
from dew.training.resume_check import (
    ResumeMismatchError,
    check_num_steps,
    check_state,
    data_layout_changes,
    remap_position,
)
from dew.training.run_history import record_start, set_aside_records, writer_of
from dew.training.sharding import Layout
from dew.training.stages import CheckpointStage, EvalStage, MetricsStage, PreviewStage
from dew.training.state import TrainState, num_updates
from dew.training.steps import (
    abstract_state,
    make_eval,
    make_init,
    make_multi_step,
    make_step,
)
from dew.training.trackers import LoggingCategory, Tracker, Trackers, make_trackers
from dew.training.trainer_config import (
    check_workdir,
    config_schema,
    make_optimizer,
    resolve_config,
)


class Trainer:
    """Runs an Objective: gradients, EMA, checkpoints, logging, previews.

    Construction resolves the config against ``config_schema()`` (``self.config`` is the
    complete config), validates it and builds every piece but writes nothing, so a bad config
    or workdir fails before any file exists. ``run`` trains (resuming from the latest checkpoint
    in ``workdir`` if there is one) and returns the final state. The Trainer knows the
    ``Objective`` contract and nothing else about what is learned.
    """

    def __init__(
        self, config: ml_collections.ConfigDict, workdir: str, trackers: list[Tracker] | None = None
    ):
        self.config = c = resolve_config(config)
        self.workdir = check_workdir(workdir)
        # The mesh and the batch splits are checked first: bad input fails before any work.
        try:
            self.mesh = sharding.spec_from_config(c.mesh).mesh()
            self.layout = Layout.for_mesh(self.mesh)
        except ValueError as e:
            raise ConfigError(f"config.mesh / config.dataset.batch_size: {e}") from e
        share = DataPartition(jax.process_index(), jax.process_count())
        local_batch = _local_batch(self.layout, share, c.dataset.batch_size, "dataset.batch_size")
        # Evaluation batches: config.eval.batch_size, or the training batch when it is None.
        eval_field = "dataset.batch_size" if c.eval.batch_size is None else "eval.batch_size"
        local_eval_batch = (
            local_batch
            if c.eval.batch_size is None
            else _local_batch(self.layout, share, c.eval.batch_size, eval_field)
        )
        self.train_source = open_split(c.dataset, "train")
        self.val_source = open_split(c.dataset, "validation")
        self.train_data = _dataset(self.train_source, local_batch, c, share, shuffle=True)
        self.val_data = _dataset(
            self.val_source,
            local_eval_batch,
            c,
            share,
            shuffle=False,
            field=eval_field,
            hint=" (set config.eval.batch_size for a smaller validation batch)"
            if c.eval.batch_size is None
            else "",
        )
        self.objective: Objective = build_objective(c, self.train_source)
        self.optimizer = make_optimizer(c)
        self.ema = ema_lib.spec_from_config(c.ema)
        self.accumulation = c.train.accumulation
        self.power_ema = power_ema_from_config(c)
        init = make_init(
            self.objective, self.optimizer, self.ema, accumulation=self.accumulation, power_ema=self.power_ema
        )
        try:
            abstract = abstract_state(init, self.example_batch())
        except (ValueError, TypeError) as e:  # e.g. a convolutional model given 2D points
            raise ConfigError(
                f"config.model (name={c.model.name!r}) / config.objective (name={c.objective.name!r}) cannot "
                f"build parameters for {self.train_source.name!r} batches: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}"
            ) from None
        try:
            self.ema.check(abstract.params)
        except ValueError as e:
            raise ConfigError(f"config.ema.tracks={c.ema.tracks!r}: {e}") from e
        self.state_shardings = self.layout.state_shardings(abstract)
        self._abstract_state = abstract_like(abstract, self.state_shardings)  # what the step is given
        self.init = self.layout.jit_init(init, abstract)
        step = make_step(
            self.objective, self.optimizer, self.ema, accumulation=self.accumulation, power_ema=self.power_ema
        )
        self._step = self.layout.jit_step(step, abstract)
        k = c.train.steps_per_call  # > 1: k steps per dispatch (fit ends each call on the cadences)
        self._multi_step = None
        if k > 1:
            self._multi_step = self.layout.jit_multi_step(make_multi_step(step, k), abstract, k)
        self.eval = jax.jit(
            make_eval(self.objective, self.ema, accumulation=self.accumulation),
            in_shardings=(self.state_shardings, self.layout.batch_sharding, self.layout.replicated),
            out_shardings=self.layout.replicated,
        )
        self._debiased = jax.jit(
            functools.partial(_debias, spec=self.ema, accumulation=self.accumulation),
            in_shardings=(self.state_shardings.ema, self.layout.replicated),
            out_shardings=self.layout.replicated,
        )
        self.checkpoint_settings = cs = checkpoint_settings(c.checkpoint)
        # Every checkpoint records the EMA it holds, so restore_ema debiases it on its own.
        self.ema_record = ema_lib.record(self.ema, abstract.params, self.accumulation)
        # None when config.checkpoint.every is None or 0 (no checkpointer).
        self.checkpoints: Checkpoints | None = cs.checkpoints(self.workdir, ema=self.ema_record)
        self.restored_step: int | None = None  # set by initial_state
        self.extra_trackers = trackers or []
        self._check_cadences()

    def _check_cadences(self) -> None:
        c = self.config
        if c.preview.every and not self.objective.has_preview:
            raise ConfigError(
                f"config.preview.every={c.preview.every} is invalid: {type(self.objective).__name__} has no "
                "preview; expected 0"
            )
        if c.preview.metrics:  # score(None, ...) checks the names without scoring anything
            metrics = {name: registry.metrics[name] for name in c.preview.metrics}
            self.objective.score(None, metrics)
            for name, metric in metrics.items():  # e.g. fid's reference statistics and weights
                try:
                    getattr(metric, "check_ready", lambda: None)()
                except (OSError, ValueError) as e:
                    raise ConfigError(f"config.preview.metrics: {name!r} cannot be scored: {e}") from None
        if c.eval.every:
            try:  # fail now, not at the first evaluation
                self.val_data.first(c.eval.num_batches)
            except ValueError as e:
                raise ConfigError(f"config.eval.num_batches={c.eval.num_batches} is invalid: {e}") from None
        elif c.checkpoint.keep_best and c.checkpoint.best_metric == "loss" and c.checkpoint.every:
            print(
                "warning: config.checkpoint.keep_best=True but config.eval.every=0: without evaluation "
                "there is no loss to rank checkpoints by, so no best checkpoint is kept",
                file=sys.stderr,
                flush=True,
            )

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

    def debiased_ema(self, state: TrainState) -> Any:
        """The EMA parameters this run evaluates, previews and exports: debiased with the run's
        ``EMASpec`` and accumulation (eagerly, on the host's arrays; ``preview_params`` is the
        jitted, replicated equivalent the stages use)."""
        return debiased_ema(state, self.ema, self.accumulation)

    def preview_params(self, state: TrainState) -> Any:
        """The debiased EMA, jitted and replicated on every device: what previews are drawn from."""
        return self._debiased(state.ema, state.step)

    def initial_state(self) -> TrainState:
        """The state the run starts from, as ``config.checkpoint`` asks.

        With ``restore_checkpoint_if_exists`` (the default) or ``step_to_restore``: the latest
        (or that) checkpoint of this run, or of ``restore_dir`` while this run has none yet,
        with its data position; ``restore_optimizer_state`` / ``restore_rng_key`` set to False
        keep the fresh state's values. ``clear_previous_checkpoints`` deletes this run's
        checkpoints first. A run that does not restore refuses a directory that holds checkpoints.
        """
        s = self.checkpoint_settings

        def fresh() -> TrainState:
            return self.init(jax.random.PRNGKey(self.config.seed), self.example_batch())

        if self.checkpoints is None:  # checkpointing off (a restore request was refused by the config)
            return fresh()
        if s.clear_previous_checkpoints:
            self.checkpoints.clear()
            aside = set_aside_records(self.workdir)
            if aside:
                print(f"previous tracking and previews moved to {aside}", flush=True)
        if not s.restores:
            latest = self.checkpoints.latest_step()
            if latest is not None:
                raise CheckpointRestorationError(
                    f"{self.checkpoints.directory} already holds checkpoints (latest step "
                    f"{latest}) and config.checkpoint.restore_checkpoint_if_exists=False: "
                    "set clear_previous_checkpoints=True to start over, or choose another --workdir"
                )
            return fresh()
        source = self.checkpoints
        if s.restore_dir is not None and self.checkpoints.latest_step() is None:
            source = Checkpoints(s.restore_dir, read_only=True)
        if s.step_to_restore is None and source.latest_step() is None:
            return fresh()
        if source is self.checkpoints and s.step_to_restore is not None:
            # Rolling back: the newer steps are moved aside or deleted (and logged), so this
            # run's saves never collide with the abandoned continuation's.
            self.checkpoints.roll_back(s.step_to_restore, how=s.on_rollback)
        step = s.step_to_restore if s.step_to_restore is not None else source.latest_step()
        # The latest step may be damaged or incomplete: say so, set it aside (never delete it)
        # and fall back to the newest intact one. A step asked for by number is not replaced.
        falls_back = s.step_to_restore is None and source is self.checkpoints
        while True:
            try:
                state, position, written_by = self._restore_step(source, step, fresh)
                break
            except CheckpointDamagedError as e:
                if not falls_back:
                    raise
                aside = source.set_aside_damaged(step)
                newer = source.latest_step()
                print(
                    f"checkpoint step {step} is damaged or incomplete, kept aside in {aside}; resuming "
                    f"from {'the start' if newer is None else f'step {newer}'} ({first_line(e)})",
                    flush=True,
                )
                if newer is None:
                    return fresh()
                step = newer
        if position is not None:
            self._read_position(position, written_by, step)
        elif source is self.checkpoints:
            raise CheckpointRestorationError(
                f"checkpoint step {step} ({source.path(step)}) holds no data position (its 'data' "
                "item is missing): resuming would silently restart the data stream from its first "
                "batch. Restore another step with config.checkpoint.step_to_restore, or start over"
            )
        self.restored_step = int(jax.device_get(state.step))
        return state

    def _restore_step(
        self, source: Checkpoints, step: int, fresh: Callable[[], TrainState]
    ) -> tuple[TrainState, bytes | None, dict[str, Any] | None]:
        """Verify ``step``'s checksums, check it fits this config, then read it: the state, the
        data position, and run.json's record of the start that wrote it."""
        s = self.checkpoint_settings
        source.verify(step)
        written_by = writer_of(self.workdir, step) if source is self.checkpoints else None
        template = abstract_state(self.init, self.example_batch())
        check_state(
            source.stored(step),
            template,
            step,
            source.path(step),
            None if written_by is None else written_by["config"],
            self.config.to_dict(),
        )
        share = self.train_data.share
        if s.restore_optimizer_state and s.restore_rng_key:
            state, position = source.restore(template, step, share=share)
        else:
            state, position = source.resume(
                fresh(),
                step,
                share=share,
                restore_optimizer_state=s.restore_optimizer_state,
                restore_rng_key=s.restore_rng_key,
            )
        return state, position, written_by

    def _read_position(self, position: bytes, written_by: dict[str, Any] | None, step: int) -> None:
        """Continue the data stream from a checkpoint's position, carried over by example index
        when run.json says it was written with another batch size or process count."""
        batch_size, processes = self.config.dataset.batch_size, self.train_data.share.count
        old_batch, old_processes = data_layout_changes(written_by, batch_size, processes)
        if old_batch is not None:
            position, account = remap_position(
                position, old_batch, batch_size, self.train_data.batches_per_epoch
            )
            print(f"config.dataset.batch_size: {old_batch} -> {batch_size}; {account}", flush=True)
        elif old_processes is not None:
            print(
                f"number of processes changed from {old_processes} to {processes} (global batch "
                f"{batch_size} unchanged): the data position counts global batches and carries over",
                flush=True,
            )
        try:
            self.train_data.read_position(position)
        except ValueError as e:
            was = f" (written with batch size {old_batch})" if old_batch else ""
            raise ResumeMismatchError(
                f"cannot resume from step {step}: its data position{was} does not fit "
                f"config.dataset.batch_size={batch_size} on {processes} process(es): {e}"
            ) from None

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
        """The side-effect stages, in order: metrics, evaluation (``eval.every``), previews
        (``preview.every``), checkpoints (ranked by the latest evaluation loss), profiling."""
        c = self.config
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
        if c.preview.every:
            stages.append(
                PreviewStage(
                    self.objective,
                    self.preview_params,
                    os.path.join(self.workdir, "previews"),
                    tracker,
                    c.preview.every,
                    metrics={name: registry.metrics[name] for name in c.preview.metrics},
                    seed=c.seed,
                )
            )
        if self.checkpoints is not None:
            stages.append(CheckpointStage(self.checkpoints, self.train_data, c.checkpoint.every, tracker))
        if self.power_ema is not None:
            stages.append(SnapshotStage(self.power_ema_snapshots(), self.power_ema, self.accumulation))
        if c.profile.steps:
            directory = c.profile.directory or os.path.join(self.workdir, "profile")
            stages.append(ProfileWindow(c.profile.steps, directory, warmup=c.profile.warmup))
        # Last, so the step's own stages (its periodic save) have run when a signal stops it.
        stages.append(PreemptionStage(self.checkpoints, self.train_data))
        return stages

    def power_ema_snapshots(self) -> PowerEMASnapshots:
        """The run's post-hoc EMA snapshot store, ``<workdir>/power_ema``."""
        return PowerEMASnapshots(os.path.join(self.workdir, SNAPSHOT_DIR))

    def last_good_checkpoint(self) -> str | None:
        """The newest saved checkpoint's path (named when a non-finite step stops the run)."""
        latest = None if self.checkpoints is None else self.checkpoints.latest_step()
        return None if latest is None else self.checkpoints.path(latest)

    # --- the run ----------------------------------------------------------------------------------
    def check_resumable(self) -> None:
        """Bad input a resume would only find later, checked before anything is written:
        ``num_steps`` below the step to resume from (``ResumeMismatchError``)."""
        s = self.checkpoint_settings
        if self.checkpoints is None or s.clear_previous_checkpoints or not s.restores:
            return
        step = s.step_to_restore if s.step_to_restore is not None else self.checkpoints.latest_step()
        if step is not None:
            check_num_steps(self.config.train.num_steps, step, self.checkpoints.path(step))

    def compile_step_in_background(self, placed_batches: bool | None = None) -> BackgroundCompile:
        """Start compiling the program the run's first step calls (the ``steps_per_call``
        program when that is > 1), from the state's and a batch's shapes, in a thread; the
        first call finds it compiled once ``wait()`` returned (``dew.training.precompile``).

        The program is looked up by its arguments' shardings too: ``placed_batches`` says
        whether the calls pass batches already on the mesh (``Trainer.step`` does), else host
        arrays; None: as ``run`` passes them (placed where a thread prepares them ahead)."""
        placed = self._run_places_batches() if placed_batches is None else placed_batches
        batch = abstract_like(self.example_batch(), self.layout.batch_sharding if placed else None)
        if self._multi_step is not None:
            batches = (batch,) * self.config.train.steps_per_call
            return BackgroundCompile(self._multi_step, self._abstract_state, batches)
        return BackgroundCompile(self._step, self._abstract_state, batch)

    def _run_places_batches(self) -> bool:
        """Whether ``run`` hands the step batches already on the mesh: where a thread prepares
        them ahead, or several processes build global arrays from their shares."""
        return bool(self.train_data.prefetch) or jax.process_count() > 1

    def run(self) -> TrainState:
        self.check_resumable()
        os.makedirs(self.workdir, exist_ok=True)
        # The step compiles while the state is initialised or read back (start-up overlap).
        compiling = self.compile_step_in_background()
        state = self.initial_state()
        start = int(jax.device_get(state.step))
        if start:
            print(f"resuming from step {start} ({self.checkpoints.source(start)})", flush=True)
        if self.power_ema is not None:  # snapshots newer than the restored state are redone
            store = self.power_ema_snapshots()
            store.discard_after(start)
            store.close()
        if jax.process_index() == 0:
            record_start(
                self.workdir,
                self.config.to_dict(),
                start,
                processes=jax.process_count(),
                extra={"ema": self.ema_record},
            )
        tracker = self.tracker(start)
        # Host batches go straight into the jitted step, which places them on the mesh in C++
        # (a Python device_put costs the host more than the copy it would hide). Where a
        # background thread prepares batches (lazily read sources) it also places them, ahead
        # of use; several processes build global arrays from their shares before the step.
        if self._run_places_batches():
            self.train_data.set_placement(self.layout.place_batch)
        try:
            compiling.wait()
            state = fit(
                state,
                self._step,
                iter(self.train_data),
                self.config.train.num_steps,
                self.stages(tracker),
                nonfinite=self.config.train.nonfinite,
                last_good=self.last_good_checkpoint,
                max_skipped=self.config.train.max_skipped,
                skip_window=self.config.train.log_every,
                steps_per_call=self.config.train.steps_per_call,
                multi_step_fn=self._multi_step,
            )
        finally:
            self.train_data.set_placement(None)
            tracker.close()
        return state


def _debias(ema: Any, step: jax.Array, *, spec: EMASpec, accumulation: int) -> Any:
    return ema_lib.debias(ema, spec, num_updates(step, accumulation))


def debiased_ema(state: TrainState, decay: float | EMASpec, accumulation: int = 1) -> Any:
    """The EMA parameters a user samples or exports with (``decay``: the run's EMASpec or β;
    ``Trainer.debiased_ema`` passes the run's own)."""
    return ema_lib.debias(state.ema, decay, num_updates(int(jax.device_get(state.step)), accumulation))


# --- building the pieces a config names --------------------------------------------------------------
def open_split(section: ml_collections.ConfigDict, split: str) -> Any:
    """The ``split`` of the registered source ``config.dataset`` names, with its options; a
    source that cannot be opened is a ``ConfigError`` naming the data set."""
    options = {k: v for k, v in section.items() if k not in ("name", "batch_size")}
    try:
        return registry.datasets[section.name](split, **options)
    except ConfigError:
        raise
    except (ValueError, KeyError, OSError, TypeError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ConfigError(
            f"config.dataset.name={section.name!r}: cannot open its {split!r} split "
            f"({type(e).__name__}: {message})"
        ) from None


def _local_batch(layout: Layout, share: DataPartition, size: int, field: str) -> int:
    """This process's share of a global batch of ``size`` (``config.<field>``); a size the mesh's
    data-parallel axes or the process count do not divide is a ``ConfigError`` naming the field."""
    try:
        layout.check_batch(size, f"config.{field}")
    except ValueError as e:
        raise ConfigError(f"config.mesh / config.{field}: {e}") from e
    if size % share.count:
        raise ConfigError(
            f"config.{field}={size} is invalid: expected a multiple of the "
            f"{share.count} processes (each reads an equal share)"
        )
    return size // share.count


def _dataset(
    source: Any,
    local_batch: int,
    c: ml_collections.ConfigDict,
    share: DataPartition,
    *,
    shuffle: bool,
    field: str = "dataset.batch_size",
    hint: str = "",
):
    try:
        return Dataset(source, local_batch, seed=c.seed, share=share, shuffle=shuffle)
    except ValueError as e:
        value = local_batch * share.count
        raise ConfigError(f"config.{field}={value} is invalid: {e}{hint}") from None


def build_objective(config: ml_collections.ConfigDict, source: Any) -> Objective:
    """``config.objective.name``'s objective, built by its ``from_config``; a ValueError it raises
    about the config becomes a ``ConfigError``."""
    component = registry.objectives[config.objective.name]
    try:
        objective = component.from_config(config, source)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"config.objective (name={config.objective.name!r}): {e}") from None
    if not isinstance(objective, Objective):
        raise TypeError(f"{component!r}.from_config returned {type(objective).__name__}, not an Objective")
    return objective


__all__ = [
    "Trainer",
    "check_workdir",
    "config_schema",
    "debiased_ema",
    "make_optimizer",
    "resolve_config",
]
