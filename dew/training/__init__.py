"""The trainer: pure stages (``init``/``step``/``eval``), side-effect stages and ``fit``, over
the ``Objective`` contract and ``TrainState`` (defined in ``dew.contracts``, exported here too).

Importing this package pulls in no modality (diffusion, sampling, models, encoders, metrics,
dataset sources) and no tracker backend; names resolve lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dew.lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "Checkpoints": "dew.checkpointing.checkpoints",
    "CheckpointRestorationError": "dew.checkpointing.errors",
    "CheckpointWriteError": "dew.checkpointing.errors",
    "get_debiased_ema": "dew.averaging.ema",
    "save_run_metadata": "dew.run_records",
    "read_run_metadata": "dew.run_records",
    "Objective": "dew.contracts.objective",
    "Step": "dew.contracts.objective",
    "Aux": "dew.contracts.objective",
    "EMASpec": "dew.averaging.ema",
    "config_schema": "dew.training.trainer",
    "TrainState": "dew.contracts.state",
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
    "TrainingIOHandlerConfig": "dew.checkpointing.io_handler",
    "Checkpointer": "dew.checkpointing.checkpointer",
    "CheckpointerConfig": "dew.checkpointing.checkpointer",
    "MeshSpec": "dew.training.sharding",
    "Layout": "dew.training.sharding",
    "Evaluation": "dew.training.evaluation",
    "evaluate": "dew.training.evaluation",
    "ProfileWindow": "dew.training.profile",
    "profile": "dew.training.profile",
}

if TYPE_CHECKING:  # the lazy names, visible to type checkers (tests/test_types.py keeps them in step)
    from dew.averaging.ema import EMASpec, get_debiased_ema
    from dew.checkpointing.checkpointer import Checkpointer, CheckpointerConfig
    from dew.checkpointing.checkpoints import Checkpoints
    from dew.checkpointing.errors import CheckpointRestorationError, CheckpointWriteError
    from dew.checkpointing.io_handler import TrainingIOHandler, TrainingIOHandlerConfig
    from dew.contracts.objective import Aux, Objective, Step
    from dew.contracts.state import TrainState
    from dew.run_records import read_run_metadata, save_run_metadata
    from dew.tracking.console import convert_mse_to_rmse_in_logs, log_metrics_to_line, log_metrics_to_table
    from dew.tracking.trackers import (
        LocalTracker,
        LoggingCategory,
        MLflowTracker,
        TensorBoardTracker,
        Tracker,
        Trackers,
        WandbTracker,
        convert_mse_to_rmse,
    )
    from dew.training.evaluation import Evaluation, evaluate
    from dew.training.loop import Stage, StepContext, fit
    from dew.training.profile import ProfileWindow, profile
    from dew.training.sharding import Layout, MeshSpec
    from dew.training.steps import make_eval, make_init, make_step
    from dew.training.trainer import Trainer, config_schema


__getattr__, __dir__ = _lazy_exports(globals(), _EXPORTS)


# A literal list (type checkers read it); tests/test_types.py checks it names exactly _EXPORTS.
__all__ = [
    "Aux",
    "CheckpointRestorationError",
    "CheckpointWriteError",
    "Checkpointer",
    "CheckpointerConfig",
    "Checkpoints",
    "EMASpec",
    "Evaluation",
    "Layout",
    "LocalTracker",
    "LoggingCategory",
    "MLflowTracker",
    "MeshSpec",
    "Objective",
    "ProfileWindow",
    "Stage",
    "Step",
    "StepContext",
    "TensorBoardTracker",
    "Tracker",
    "Trackers",
    "TrainState",
    "Trainer",
    "TrainingIOHandler",
    "TrainingIOHandlerConfig",
    "WandbTracker",
    "config_schema",
    "convert_mse_to_rmse",
    "convert_mse_to_rmse_in_logs",
    "evaluate",
    "fit",
    "get_debiased_ema",
    "log_metrics_to_line",
    "log_metrics_to_table",
    "make_eval",
    "make_init",
    "make_step",
    "profile",
    "read_run_metadata",
    "save_run_metadata",
]
