"""``Checkpointer``: the stix API for persisting and restoring a training state via orbax.

A thin layer over ``Checkpoints``: the same directory format, writer and store; only the
retention (stix's ``keep_best``), the save cadence and the call signatures differ. A stix
``TrainingState`` is dew's ``TrainState``; a params ``State`` is a params pytree.

The stix configs (``CheckpointerConfig`` here, ``TrainingIOHandlerConfig`` beside its handler)
are pydantic models, as the stix text documents them (``Bases: BaseModel``). Validation,
coercion and error messages are pydantic's: keyword-only construction, ``Gt(0)`` bounds on the
counts, ``model_config`` exactly as documented (the IO handler's config forbids unknown keys; the
checkpointer's allows arbitrary types and, as pydantic does by default, ignores unknown keys). A
bad value raises ``pydantic.ValidationError`` (a ``ValueError``) naming the field, the value given
and what it expected. ``model_dump()`` gives the fields as a dict. The stix modules are the only
ones in dew that import pydantic, and nothing imports them on ``import dew`` or for a run: they
load when a stix name is first named.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeAlias

import jax
import numpy as np
import pydantic

from dew.averaging import ema as ema_lib
from dew.averaging.ema import EMASpec
from dew.checkpointing.checkpoints import Checkpoints
from dew.checkpointing.layout import ASSUMED
from dew.checkpointing.retention import Retention
from dew.contracts.state import TrainState

#: The metric a stix save reports, and ranks by.
EVAL_LOSS = "eval_loss"

PathLike: TypeAlias = str | os.PathLike
#: An int > 0, spelt as the stix text shows it (``Annotated[int, Field(gt=0)]``).
PositiveInt = Annotated[int, pydantic.Field(gt=0)]


class CheckpointerConfig(pydantic.BaseModel):
    """Configuration for ``Checkpointer``.

    checkpoint_dir: directory to write to (required; a path or URI).
    max_to_keep:    checkpoints to retain (int > 0); None disables pruning entirely, the right
                    setting for read-only managers pointed at a foreign directory. Default 5.
    save_interval_steps: save every N training steps (int > 0). Default 100.
    keep_best:      True: keep the best ``max_to_keep`` by eval_loss plus the most recent; False:
                    the most recent ``max_to_keep``. Default True.
    enable_async_checkpointing: write asynchronously. Default False (synchronous, in case of
                    crashes).
    """

    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)

    checkpoint_dir: PathLike
    max_to_keep: pydantic.PositiveInt | None = 5
    save_interval_steps: pydantic.PositiveInt = 100
    keep_best: bool = True
    enable_async_checkpointing: bool = False


def _spec(decay: float | EMASpec) -> EMASpec:
    return decay if isinstance(decay, EMASpec) else EMASpec(decay=float(decay))


def stix_retention(max_to_keep: int | None, keep_best: bool) -> Retention:
    """stix's policy: ``keep_best`` keeps the ``max_to_keep`` lowest eval losses plus the newest
    step (up to ``max_to_keep + 1``); otherwise the newest ``max_to_keep``; None keeps all."""
    if max_to_keep is None:
        return Retention(newest=None, metric=EVAL_LOSS)
    if keep_best:
        return Retention(newest=1, best=max_to_keep, metric=EVAL_LOSS)
    return Retention(newest=max_to_keep, best=0, metric=EVAL_LOSS)


class Checkpointer:
    """Persist and restore a TrainState via orbax.

    ``config`` is a ``CheckpointerConfig`` (or a mapping of its fields). Dew extensions, all
    keyword-only and optional: ``upload(path)`` is called after each save lands (it may return a
    future that ``wait_until_finished`` waits for), ``read_only=True`` opens a foreign directory
    for restoring only, ``ema_decay`` (a β or an ``EMASpec``) is the EMA law of states that carry
    none of their own (built by hand rather than by ``make_init``).
    """

    Config = CheckpointerConfig

    def __init__(
        self,
        config: CheckpointerConfig | Mapping[str, Any],
        *,
        upload: Callable[[str], Any] | None = None,
        read_only: bool = False,
        ema_decay: float | EMASpec | None = None,
    ):
        if isinstance(config, Mapping):
            config = CheckpointerConfig(**config)
        if not isinstance(config, CheckpointerConfig):
            raise TypeError(f"Checkpointer: config must be a CheckpointerConfig, got {type(config).__name__}")
        self.config = config
        self.ema_decay = None if ema_decay is None else _spec(ema_decay)
        self._told_default = False
        self.checkpoints = Checkpoints(
            config.checkpoint_dir,
            retention=stix_retention(config.max_to_keep, config.keep_best),
            asynchronous=config.enable_async_checkpointing,
            upload=upload,
            read_only=read_only,
        )

    @property
    def directory(self) -> str:
        return self.checkpoints.directory

    def should_save(self, step: int) -> bool:
        """Orbax's default decision: every ``save_interval_steps`` steps, and the first save into
        a directory without checkpoints."""
        return step % self.config.save_interval_steps == 0 or self.latest_step() is None

    def save(
        self,
        training_state: TrainState,
        step: int,
        eval_loss: float,
        dataset_state: Any | Mapping[str, Any] | None = None,
        *,
        ema_decay: float | EMASpec | None = None,
    ) -> None:
        """Persist ``training_state`` under ``step`` as independently-loadable items.

        ``step`` is the checkpoint's key, whatever step count the state holds (that count is
        recorded beside it, and a restore checks it). The state is split across orbax items
        ``params``, ``opt_state``, ``ema_params`` (the raw, non-debiased EMA) and ``extra`` (the
        small scalars: step count, rng key and the EMA's law), so each can be restored on its own
        and ``restore_ema`` debiases from ``ema_params`` + ``extra``; ``eval_loss`` ranks the
        checkpoint (stored in its metrics as ``eval_loss``); ``dataset_state`` is any pytree (e.g.
        a grain iterator state), saved when not None. A step that ``should_save`` declines is
        skipped (orbax's cadence). A step already on disk, or a bad argument, is refused here,
        before anything is queued (with asynchronous writes too).

        The EMA's law recorded is the state's own (``TrainState.ema_law``, set by ``make_init``),
        else ``ema_decay`` (dew extension: a β or an ``EMASpec``; this call's, else the
        constructor's), else ``EMASpec()``'s default (decay 0.999), said once in one line, kept
        in the step's metadata only (the state round-trips as given) and marked as assumed, so
        that ``restore_ema(decay=...)`` may replace it. An ``ema_decay`` that contradicts the law
        a state carries is an error.
        """
        if not self.should_save(step):
            return
        training_state, record = self._with_law(training_state, ema_decay)
        metrics = {EVAL_LOSS: float(np.asarray(jax.device_get(eval_loss)))}
        self.checkpoints.save(
            step, training_state, None, metrics, dataset_state=dataset_state, ema=record, keyed=True
        )

    def _with_law(
        self, state: TrainState, ema_decay: float | EMASpec | None
    ) -> tuple[TrainState, dict[str, Any] | None]:
        """``state`` carrying an EMA law, and the record to keep when that law is assumed."""
        given = _spec(ema_decay) if ema_decay is not None else self.ema_decay
        if state.ema_law is not None:
            if given is not None:
                carried, _ = ema_lib.from_law(jax.device_get(state.ema_law), state.params)
                if not ema_lib.same_law(carried, given):
                    raise ValueError(
                        f"Checkpointer.save: ema_decay={ema_decay if ema_decay is not None else given!r} "
                        f"contradicts the EMA law the state carries (decay={carried.decay}, "
                        f"half_life={carried.half_life}, ramp_up={carried.ramp_up}); leave ema_decay unset"
                    )
            return state, None
        if given is not None:
            return state.replace(ema_law=ema_lib.law(given, state.params)), None
        default = EMASpec()
        if not self._told_default:
            self._told_default = True
            print(
                f"Checkpointer: the state carries no EMA law and no ema_decay was given; recording the "
                f"default decay {default.decay} for restore_ema (pass ema_decay= to record the run's)",
                flush=True,
            )
        # Kept in the step's metadata only: the state round-trips as it was given.
        return state, {**ema_lib.record(default, state.params), ASSUMED: True}

    def restore(
        self,
        training_state: TrainState,
        dataset_state: Any | Mapping[str, Any] | None = None,
        step: int | None = None,
        restore_optimizer_state: bool = True,
        restore_rng_key: bool = True,
    ) -> tuple[TrainState, Any | Mapping[str, Any] | None] | None:
        """Restore a TrainState and dataset state, defaulting to the latest checkpoint.

        ``training_state`` is a freshly initialised state of the right structure (its shapes,
        dtypes and shardings are the template); with ``restore_optimizer_state=False`` its
        opt_state is kept (the checkpoint's is not read), with ``restore_rng_key=False`` its key.
        ``dataset_state`` is a fresh dataset state of the right structure; the returned one is
        None when it is None or the checkpoint holds none. Returns None when no checkpoint exists.
        Raises ``CheckpointRestorationError`` (a ``ValueError``) when the restored step count
        disagrees with the one recorded in the checkpoint's metadata, or ``step`` is not stored.
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                return None
        state, _ = self.checkpoints.resume(
            training_state,
            step,
            restore_optimizer_state=restore_optimizer_state,
            restore_rng_key=restore_rng_key,
        )
        dataset = None
        if dataset_state is not None:
            dataset = self.checkpoints.restore_dataset_state(dataset_state, step)
        return state, dataset

    def restore_ema(
        self, template: Any, step: int | None = None, *, decay: float | EMASpec | None = None
    ) -> Any:
        """Restore the debiased EMA parameters for offline sampling or evaluation.

        Reads only the ``ema_params`` and ``extra`` items, never params or opt_state (a step whose
        params are gone is served), then applies the live loop's bias correction
        ``ema / (1 - decay ** num_steps)``. ``template`` is a params pytree of the right structure
        (shape/dtype, optionally sharded), or None for host arrays; ``step`` defaults to
        ``latest_step()``. The decay (or half-life schedule), the accumulation and the tracked
        leaves are ``extra``'s (the state's ``ema_law``, or the law ``save`` recorded for a state
        without one); ``decay`` (dew extension) checks it, replaces a law ``save`` assumed by
        default, and is needed for a checkpoint that records none (written by another saver).
        Raises ``ValueError`` (``CheckpointRestorationError``) if no checkpoint exists or no
        decay is known.
        """
        return self.checkpoints.restore_ema(template, step, decay=decay)

    def latest_step(self) -> int | None:
        """Return the most recent checkpoint step, or None."""
        return self.checkpoints.latest_step()

    def best_step(self) -> int | None:
        """Return the best-``eval_loss`` (lowest) checkpoint step, or None."""
        return self.checkpoints.best_step()

    def all_steps(self) -> list[int]:
        """The steps on disk (dew extension)."""
        return self.checkpoints.all_steps()

    def wait_until_finished(self) -> None:
        """Block until any pending asynchronous saves (and uploads) complete; re-raise a failure."""
        self.checkpoints.wait()

    def close(self) -> None:
        """Wait, then release the manager and the writer thread."""
        self.checkpoints.close()

    def __repr__(self) -> str:
        return f"Checkpointer({os.fspath(self.directory)!r})"
