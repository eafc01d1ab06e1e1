"""Checkpointing: one run's checkpoints, their on-disk format, and the stix-named layer on top.

One idea per module:

- ``checkpoints``: ``Checkpoints``, the facade a run uses (save, restore, restore_ema, ...);
- ``restore``: ``RestorePolicy``, which state a run starts from as ``config.checkpoint`` asks,
  and the checks that a checkpoint fits the run before any value is read
  (``ResumeMismatchError``);
- ``settings``: ``config.checkpoint`` read and validated;
- ``tiers``: which tier holds a step, and reading it from there;
- ``store``: the persistent tier, one orbax checkpoint per step in a path or URI;
- ``item_reads``: a persistent step's items read through orbax (which items a restore reads,
  the template checked against what is stored, a failed read narrowed to its item);
- ``saves``: what the writer thread runs for one save (a persistent step then its upload, or
  the local step) and the metrics a save reports, checked;
- ``local``: the per-host local tier, the shards each process's devices hold;
- ``writer``: the background thread writes run on;
- ``direct_write``: a small state's step written by dew itself, in the files orbax writes without
  OCDBT (orbax's fixed per-save cost is most of a small save's), checksummed, then renamed into place;
- ``layout``: what a checkpoint is: its directory (a path or URI, ``etils.epath``), its items,
  ``TrainState`` <-> items in one place, and the EMA record a step keeps;
- ``step_files``: one step read from its files (metadata, items, completeness);
- ``weights``: one step's weights (the debiased EMA or the live parameters) for a reader that
  samples or scores (``dew.pipeline``), read-only from the persistent tier with no writer, tiers
  or retention, and the EMA's debiasing ``Checkpoints.restore_ema`` shares;
- ``checksums``: the per-item checksums written after the data and verified before a read (with
  the orbax handler that writes them);
- ``retention``: ``Retention``, which steps a directory keeps;
- ``positions``: where the data resumes: data positions beside the share that read them, and a
  caller's own dataset state;
- ``errors``: ``CheckpointRestorationError`` (``CheckpointDamagedError``), ``CheckpointWriteError``,
  ``ConfigValidationError``;
- ``checkpointer``, ``io_handler``: the stix API (``Checkpointer`` and ``TrainingIOHandler``,
  each with its pydantic config), a thin layer over the same machinery.

``TrainState`` comes from the contracts below (``dew.contracts.state``), never from the trainer;
``run.json`` and the run's other records are the run's, not a checkpoint's (``dew.run_records``;
``save_run_metadata``, ``read_run_metadata`` and ``RUN_METADATA`` are exported here too, as the
stix text names them).

Names resolve lazily, so importing the package opens no backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dew.lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "Checkpoints": "dew.checkpointing.checkpoints",
    "CheckpointDamagedError": "dew.checkpointing.errors",
    "CheckpointRestorationError": "dew.checkpointing.errors",
    "CheckpointWriteError": "dew.checkpointing.errors",
    "Retention": "dew.checkpointing.retention",
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
    from dew.checkpointing.retention import Retention
    from dew.checkpointing.settings import CheckpointSettings, checkpoint_settings
    from dew.run_records import RUN_METADATA, read_run_metadata, save_run_metadata


__getattr__, __dir__ = _lazy_exports(globals(), _EXPORTS)


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
