"""The stix configs, ``TrainingIOHandlerConfig`` and ``CheckpointerConfig``: pydantic models, as
the stix text documents them (``Bases: BaseModel``).

Validation, coercion and error messages are pydantic's: keyword-only construction, ``Gt(0)``
bounds on the counts, ``model_config`` exactly as documented (the IO handler's config forbids
unknown keys; the checkpointer's allows arbitrary types and, as pydantic does by default, ignores
unknown keys). A bad value raises ``pydantic.ValidationError`` (a ``ValueError``) naming the
field, the value given and what it expected. ``model_dump()`` gives the fields as a dict.

This module is the only one in dew that imports pydantic, and nothing imports it on
``import dew`` or for a run: it loads when a stix config (or ``Checkpointer`` /
``TrainingIOHandler``) is first named.
"""

from __future__ import annotations

import os
from typing import Annotated, TypeAlias

import pydantic

from dew.checkpointing.errors import ConfigValidationError

__all__ = ["CheckpointerConfig", "ConfigValidationError", "TrainingIOHandlerConfig"]

PathLike: TypeAlias = str | os.PathLike
#: An int > 0, spelt as the stix text shows it (``Annotated[int, Field(gt=0)]``).
PositiveInt = Annotated[int, pydantic.Field(gt=0)]


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
