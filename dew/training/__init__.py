"""The trainer: the ``Objective`` contract, pure stages (``init``/``step``/``eval``), side-effect
stages and ``fit``.

Importing this package pulls in no modality (diffusion, sampling, models, encoders, metrics,
dataset sources) and no tracker backend; names resolve lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Checkpoints": "dew.checkpointing.checkpoints",
    "CheckpointRestorationError": "dew.checkpointing.errors",
    "CheckpointWriteError": "dew.checkpointing.errors",
    "get_debiased_ema": "dew.averaging.ema",
    "save_run_metadata": "dew.checkpointing.run_metadata",
    "read_run_metadata": "dew.checkpointing.run_metadata",
    "Objective": "dew.training.objective",
    "Step": "dew.training.objective",
    "Aux": "dew.training.objective",
    "EMASpec": "dew.averaging.ema",
    "config_schema": "dew.training.trainer",
    "TrainState": "dew.training.state",
    "Trainer": "dew.training.trainer",
    "fit": "dew.training.loop",
    "Stage": "dew.training.loop",
    "StepContext": "dew.training.loop",
    "make_init": "dew.training.steps",
    "make_step": "dew.training.steps",
    "make_eval": "dew.training.steps",
    "Tracker": "dew.tracking.trackers",
    "Trackers": "dew.tracking.trackers",
    "LocalTracker": "dew.tracking.trackers",
    "TensorBoardTracker": "dew.tracking.trackers",
    "MLflowTracker": "dew.tracking.trackers",
    "WandbTracker": "dew.tracking.trackers",
    "LoggingCategory": "dew.tracking.trackers",
    "convert_mse_to_rmse": "dew.tracking.trackers",
    "log_metrics_to_line": "dew.tracking.console",
    "log_metrics_to_table": "dew.tracking.console",
    "convert_mse_to_rmse_in_logs": "dew.tracking.console",
    "TrainingIOHandler": "dew.checkpointing.io_handler",
    "TrainingIOHandlerConfig": "dew.checkpointing.stix_config",
    "Checkpointer": "dew.checkpointing.checkpointer",
    "CheckpointerConfig": "dew.checkpointing.stix_config",
    "MeshSpec": "dew.training.sharding",
    "Layout": "dew.training.sharding",
    "Evaluation": "dew.training.evaluation",
    "evaluate": "dew.training.evaluation",
    "ProfileWindow": "dew.training.profile",
    "profile": "dew.training.profile",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dew.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
