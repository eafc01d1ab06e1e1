"""Checkpointing: one run's checkpoints, their on-disk format, and the stix-named layer on top.

One idea per module:

- ``checkpoints``: ``Checkpoints``, the facade a run uses (save, restore, restore_ema, ...);
- ``store``: the persistent tier, one orbax checkpoint per step in a path or URI;
- ``local``: the per-host local tier, the shards each process's devices hold;
- ``writer``: the background thread writes run on;
- ``layout``: the items of a checkpoint, and TrainState <-> items in one place;
- ``positions``: data positions beside the share that read them;
- ``retention``: which steps a directory keeps;
- ``paths``: directories as paths or URIs (``etils.epath``);
- ``settings``: ``config.checkpoint`` read and validated;
- ``errors``: ``CheckpointRestorationError`` (``CheckpointDamagedError``), ``CheckpointWriteError``,
  ``ConfigValidationError``;
- ``integrity``: per-item checksums, written after the data and verified before a read;
- ``run_metadata``: ``run.json`` beside ``checkpoints/``;
- ``checkpointer``, ``io_handler``, ``stix_config``: the stix API (``Checkpointer``,
  ``TrainingIOHandler`` and their pydantic configs), a thin layer over the same machinery.

Names resolve lazily, so importing the package opens no backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Checkpoints": "dew.checkpointing.checkpoints",
    "CheckpointDamagedError": "dew.checkpointing.errors",
    "CheckpointRestorationError": "dew.checkpointing.errors",
    "CheckpointWriteError": "dew.checkpointing.errors",
    "Retention": "dew.checkpointing.step_files",
    "save_run_metadata": "dew.run_records",
    "read_run_metadata": "dew.run_records",
    "RUN_METADATA": "dew.run_records",
    "CheckpointSettings": "dew.checkpointing.settings",
    "Checkpointer": "dew.checkpointing.checkpointer",
    "CheckpointerConfig": "dew.checkpointing.checkpointer",
    "TrainingIOHandler": "dew.checkpointing.io_handler",
    "TrainingIOHandlerConfig": "dew.checkpointing.io_handler",
    "ConfigValidationError": "dew.checkpointing.errors",
    "checkpoint_settings": "dew.checkpointing.settings",
}

if TYPE_CHECKING:  # the lazy names, visible to type checkers (tests/test_types.py keeps them in step)
    from dew.checkpointing.checkpointer import Checkpointer, CheckpointerConfig
    from dew.checkpointing.checkpoints import Checkpoints
    from dew.checkpointing.errors import (
        CheckpointDamagedError,
        CheckpointRestorationError,
        CheckpointWriteError,
        ConfigValidationError,
    )
    from dew.checkpointing.io_handler import TrainingIOHandler, TrainingIOHandlerConfig
    from dew.checkpointing.settings import CheckpointSettings, checkpoint_settings
    from dew.checkpointing.step_files import Retention
    from dew.run_records import RUN_METADATA, read_run_metadata, save_run_metadata


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dew.checkpointing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


# A literal list (type checkers read it); tests/test_types.py checks it names exactly _EXPORTS.
__all__ = [
    "RUN_METADATA",
    "CheckpointDamagedError",
    "CheckpointRestorationError",
    "CheckpointSettings",
    "CheckpointWriteError",
    "Checkpointer",
    "CheckpointerConfig",
    "Checkpoints",
    "ConfigValidationError",
    "Retention",
    "TrainingIOHandler",
    "TrainingIOHandlerConfig",
    "checkpoint_settings",
    "read_run_metadata",
    "save_run_metadata",
]
