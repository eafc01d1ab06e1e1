"""``TrainingIOHandler``: the stix IO handler for a training loop, checkpoints plus loggers.

Checkpointing is delegated to a ``Checkpointer`` (the same format as dew's ``Checkpoints``);
logging to the logger callbacks attached to it, ``(category, values, step) -> None``, such as
``log_metrics_to_line`` or any dew ``Tracker``. Its config, ``TrainingIOHandlerConfig``, is a
pydantic model as ``CheckpointerConfig`` is (``checkpointer`` says how they validate).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import jax
import numpy as np
import pydantic

from dew.averaging.ema import EMASpec
from dew.checkpointing.checkpointer import Checkpointer, CheckpointerConfig, PathLike, PositiveInt
from dew.checkpointing.checkpoints import Checkpoints
from dew.checkpointing.errors import CheckpointRestorationError, ConfigValidationError
from dew.contracts.state import TrainState
from dew.tracking.base import LoggingCategory

Logger = Callable[[LoggingCategory, dict[str, Any], int], None]
log = logging.getLogger("dew.checkpoints")


class TrainingIOHandlerConfig(pydantic.BaseModel):
    """Pydantic config holding all settings relevant for the training IO handler.

    checkpoint_dir:  root checkpoint directory, a local path or any URI scheme orbax's path
                     handling supports; None skips the clear_previous_checkpoints guard. Default None.
    restore_dir:     directory to restore checkpoints from; None: ``checkpoint_dir``.
    max_to_keep:     checkpoints to retain (int > 0). Default 5.
    save_interval_steps: save every N training steps (int > 0); None (the default) disables
                     checkpointing.
    keep_best:       True: keep the ``max_to_keep`` best by eval_loss plus the most recent; False:
                     the most recent ``max_to_keep``. Default True.
    enable_async_checkpointing: write asynchronously. Default False.
    restore_checkpoint_if_exists: restore a previous checkpoint if one exists. Default False.
    step_to_restore: the step to restore (int > 0); None (the default): the latest.
    restore_optimizer_state: also restore the optimizer state. Default True.
    clear_previous_checkpoints: delete previous checkpoints; cannot be True together with a
                     restore (``restore_checkpoint_if_exists`` or ``step_to_restore``). Default False.

    Unknown keys are rejected (``model_config = {'extra': 'forbid'}``).
    """

    model_config = pydantic.ConfigDict(extra="forbid")

    checkpoint_dir: PathLike | None = None
    restore_dir: PathLike | None = None
    max_to_keep: PositiveInt = 5
    save_interval_steps: PositiveInt | None = None
    keep_best: bool = True
    enable_async_checkpointing: bool = False
    restore_checkpoint_if_exists: bool = False
    step_to_restore: PositiveInt | None = None
    restore_optimizer_state: bool = True
    clear_previous_checkpoints: bool = False

    @property
    def restores(self) -> bool:
        """Whether a restore is requested."""
        return self.restore_checkpoint_if_exists or self.step_to_restore is not None

    @pydantic.model_validator(mode="after")
    def _no_clear_with_a_restore(self) -> TrainingIOHandlerConfig:
        if self.clear_previous_checkpoints and self.restores:
            raise ValueError(
                "clear_previous_checkpoints=True cannot be combined with a restore "
                f"(restore_checkpoint_if_exists={self.restore_checkpoint_if_exists}, "
                f"step_to_restore={self.step_to_restore!r}): clearing first would delete the "
                "checkpoints to restore"
            )
        return self


class TrainingIOHandler:
    """An IO handler for the training loop: checkpointing, and logging to attached loggers.

    ``config`` is a ``TrainingIOHandlerConfig`` (a mapping of its fields, or None for the
    defaults: no checkpointing). ``data_upload_fn(path)`` is called with each checkpoint's
    directory once it has landed; it may return a future, which ``wait_until_finished`` waits
    for. With ``clear_previous_checkpoints`` the checkpoints already in ``checkpoint_dir`` are
    deleted on construction. ``ema_decay`` (dew extension, keyword-only: a β or an ``EMASpec``)
    is the EMA law recorded for states that carry none of their own (``Checkpointer``).
    """

    Config = TrainingIOHandlerConfig

    def __init__(
        self,
        config: TrainingIOHandlerConfig | Mapping[str, Any] | None = None,
        data_upload_fn: Callable[[str | os.PathLike], Future | None] | None = None,
        *,
        ema_decay: float | EMASpec | None = None,
    ):
        if config is None:
            config = TrainingIOHandlerConfig()
        elif isinstance(config, Mapping):
            config = TrainingIOHandlerConfig(**config)
        if not isinstance(config, TrainingIOHandlerConfig):
            raise TypeError(
                f"TrainingIOHandler: config must be a TrainingIOHandlerConfig, got {config!r:.80}"
            )
        if config.save_interval_steps is not None and config.checkpoint_dir is None:
            raise ConfigValidationError(
                f"TrainingIOHandlerConfig.save_interval_steps={config.save_interval_steps} needs a "
                "checkpoint_dir to write to: set checkpoint_dir, or save_interval_steps=None to disable "
                "checkpointing"
            )
        self.config = config
        self.data_upload_fn = data_upload_fn
        self._loggers: list[Logger] = []
        self._best_loss: float | None = None
        self._rolled_back_to: int | None = None  # newer steps move aside at the first save past it
        if config.checkpoint_dir is not None and config.clear_previous_checkpoints:
            Checkpoints(config.checkpoint_dir, keep=None).clear()
        self.checkpointer: Checkpointer | None = None
        # (save_interval_steps without a checkpoint_dir raised above)
        if config.save_interval_steps is not None and config.checkpoint_dir is not None:
            self.checkpointer = Checkpointer(
                CheckpointerConfig(
                    checkpoint_dir=config.checkpoint_dir,
                    max_to_keep=config.max_to_keep,
                    save_interval_steps=config.save_interval_steps,
                    keep_best=config.keep_best,
                    enable_async_checkpointing=config.enable_async_checkpointing,
                ),
                upload=data_upload_fn,
                ema_decay=ema_decay,
            )

    # --- logging ----------------------------------------------------------------------------------
    def attach_logger(self, logger: Logger) -> None:
        """Attach one logging function ``(category, to_log, step_number) -> None``."""
        if not callable(logger):
            raise TypeError(f"TrainingIOHandler.attach_logger: expected a callable, got {logger!r:.80}")
        self._loggers.append(logger)

    def log(self, category: LoggingCategory, to_log: dict[str, Any], step_number: int) -> None:
        """Log ``to_log`` under ``category`` at ``step_number`` via every attached logger."""
        if not isinstance(category, LoggingCategory):
            raise TypeError(f"TrainingIOHandler.log: category must be a LoggingCategory, got {category!r}")
        for logger in self._loggers:
            logger(category, to_log, step_number)

    # --- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(
        self,
        training_state: TrainState,
        step_number: int,
        eval_loss: float,
        dataset_state: Any | Mapping[str, Any] | None = None,
    ) -> None:
        """Save a checkpoint (every ``save_interval_steps`` steps; nothing when checkpointing is
        disabled) and upload it if ``data_upload_fn`` is set. A save whose ``eval_loss`` beats
        every earlier one is logged under ``LoggingCategory.BEST_MODEL``."""
        if self.checkpointer is None or not self.checkpointer.should_save(step_number):
            return
        if self._rolled_back_to is not None and step_number > self._rolled_back_to:
            restored, self._rolled_back_to = self._rolled_back_to, None
            newer = self.checkpointer.checkpoints.roll_back(restored, announce=False)
            if newer:
                aside = self.checkpointer.checkpoints.store.last_aside
                print(
                    f"step {step_number} continues from the restored step {restored}: the newer steps "
                    f"{newer} are moved to {aside}",
                    flush=True,
                )
                self._best_loss = None  # the best may have been one of them
        loss = float(np.asarray(jax.device_get(eval_loss)))
        if self._best_loss is None:  # the best already on disk (a resumed run)
            best = self.checkpointer.best_step()
            metrics = None if best is None else self.checkpointer.checkpoints.metrics(best)
            self._best_loss = float(metrics["eval_loss"]) if metrics else float("inf")
        self.checkpointer.save(training_state, step_number, loss, dataset_state)
        if loss < self._best_loss:
            self._best_loss = loss
            self.log(LoggingCategory.BEST_MODEL, {"step": step_number, "eval_loss": loss}, step_number)

    def restore_checkpoint(
        self,
        training_state: TrainState,
        dataset_state: Any | Mapping[str, Any] | None = None,
        restore_optimizer_state: bool = True,
        restore_rng_key: bool = True,
    ) -> tuple[TrainState, Any | Mapping[str, Any] | None]:
        """Restore a TrainState, defaulting to the latest checkpoint.

        A restore is requested by ``restore_checkpoint_if_exists`` or ``step_to_restore``;
        without one the inputs come back unchanged. It reads ``restore_dir`` (default:
        ``checkpoint_dir``); the optimizer state is restored when both the argument and
        ``config.restore_optimizer_state`` say so. Restoring an older ``step_to_restore`` of the
        run's own directory changes nothing on disk: the newer steps are moved into a sibling
        directory (``<checkpoint_dir>.rolled-back-<time>/``, said in one line) when the run first
        saves past the restored step, so later saves never collide with them and a restore
        that is not followed by training leaves the directory as it was. Attached loggers get
        ``CLEANUP_AFTER_CKPT_RESTORATION`` at the restored step. Returns the restored state and
        dataset state (None when ``dataset_state`` is None or the checkpoint holds none), or the
        inputs unchanged if no checkpoint exists.

        Raises ``CheckpointRestorationError`` if a restore is requested but checkpointing is
        disabled (``save_interval_steps=None``), or ``step_to_restore`` is not stored.
        """
        c = self.config
        if not c.restores:
            return training_state, dataset_state
        if self.checkpointer is None:
            raise CheckpointRestorationError(
                "TrainingIOHandler.restore_checkpoint: a restore is requested "
                f"(restore_checkpoint_if_exists={c.restore_checkpoint_if_exists}, "
                f"step_to_restore={c.step_to_restore!r}) but checkpointing is disabled "
                "(save_interval_steps=None)"
            )
        source = self.checkpointer
        if c.restore_dir is not None:
            source = Checkpointer(
                CheckpointerConfig(checkpoint_dir=c.restore_dir, max_to_keep=None), read_only=True
            )
        step = c.step_to_restore
        if step is None and source.latest_step() is None:
            return training_state, dataset_state
        restored = source.restore(
            training_state,
            dataset_state,
            step,
            restore_optimizer_state=restore_optimizer_state and c.restore_optimizer_state,
            restore_rng_key=restore_rng_key,
        )
        assert restored is not None  # a step exists (checked above, or restore raised)
        state, dataset = restored
        restored_step = step if step is not None else source.latest_step()
        assert restored_step is not None  # restore found a step (it raised otherwise)
        if source is self.checkpointer and any(s > restored_step for s in source.all_steps()):
            self._rolled_back_to = restored_step
        self.log(LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION, {}, restored_step)
        return state, dataset

    def wait_until_finished(self) -> None:
        """Wait until checkpoints and uploads, asynchronous by nature, are finished; call at the
        end of a training run. A failed write or upload is raised here."""
        if self.checkpointer is not None:
            self.checkpointer.wait_until_finished()
