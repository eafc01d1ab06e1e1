"""The trainer: the ``Objective`` contract, pure stages (``init``/``step``/``eval``), side-effect
stages and ``fit``.

Importing this package pulls in no modality (diffusion, sampling, models, encoders, metrics,
dataset sources) and no tracker backend; names resolve lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Checkpoints": "dew.training.checkpointing.checkpoints",
    "CheckpointRestorationError": "dew.training.checkpointing.errors",
    "CheckpointWriteError": "dew.training.checkpointing.errors",
    "get_debiased_ema": "dew.training.ema",
    "save_run_metadata": "dew.training.checkpointing.run_metadata",
    "read_run_metadata": "dew.training.checkpointing.run_metadata",
    "Objective": "dew.training.objective",
    "Step": "dew.training.objective",
    "Aux": "dew.training.objective",
    "EMASpec": "dew.training.ema",
    "config_schema": "dew.training.trainer",
    "TrainState": "dew.training.state",
    "Trainer": "dew.training.trainer",
    "fit": "dew.training.loop",
    "Stage": "dew.training.loop",
    "StepContext": "dew.training.loop",
    "make_init": "dew.training.steps",
    "make_step": "dew.training.steps",
    "make_eval": "dew.training.steps",
    "Tracker": "dew.training.trackers",
    "Trackers": "dew.training.trackers",
    "LocalTracker": "dew.training.trackers",
    "TensorBoardTracker": "dew.training.trackers",
    "MLflowTracker": "dew.training.trackers",
    "WandbTracker": "dew.training.trackers",
    "LoggingCategory": "dew.training.trackers",
    "convert_mse_to_rmse": "dew.training.trackers",
    "log_metrics_to_line": "dew.training.console",
    "log_metrics_to_table": "dew.training.console",
    "convert_mse_to_rmse_in_logs": "dew.training.console",
    "TrainingIOHandler": "dew.training.checkpointing.io_handler",
    "TrainingIOHandlerConfig": "dew.training.checkpointing.stix_config",
    "Checkpointer": "dew.training.checkpointing.checkpointer",
    "CheckpointerConfig": "dew.training.checkpointing.stix_config",
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
