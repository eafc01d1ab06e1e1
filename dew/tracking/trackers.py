"""Trackers: where a run's numbers and pictures go.

A tracker receives *reports* (scalars under a logging category, or an artifact) and writes them
somewhere; ``Trackers`` fans one report out to several, and to plain logger callbacks attached
to it. The contract (categories, process 0 writes, mse -> rmse after averaging) is documented in
``dew.tracking.base``; each backend lives in a module of its own under
``dew.tracking`` and imports its library only when its first report is written:

- ``local``: ``LocalTracker``, ``scalars.jsonl`` and ``images/ videos/ text/`` (synchronous:
  small appends on the loop's thread);
- ``tensorboard``: ``TensorBoardTracker``, ``tensorboard/events.out.tfevents.*``;
- ``mlflow``: ``MLflowTracker``, ``mlflow/mlflow.db`` + ``mlflow/artifacts``, or ``mlflow_uri``;
- ``wandb``: ``WandbTracker``, ``wandb/wandb/offline-run-*`` (or online).

The last three write through a worker process each (``tracking.background``,
``tracking.process``): the loop only encodes a report and writes it to a pipe (about 20 us),
while importing the backend, opening the run and the backend's own Python work happen on
another core, never holding the loop's GIL. Paths are under the run's ``<workdir>/tracking``.

``make_trackers`` builds the configured set from ``config.tracking``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dew.schema import ConfigError, Key, Section
from dew.tracking.base import (
    Logger,
    LoggingCategory,
    Tracker,
    Trackers,
    convert_mse_to_rmse,
    is_writer_process,
)
from dew.tracking.local import LocalTracker
from dew.tracking.media import write_gif, write_png
from dew.tracking.mlflow import MLflowTracker
from dew.tracking.tensorboard import TensorBoardTracker
from dew.tracking.wandb import MODES as WANDB_MODES
from dew.tracking.wandb import WandbTracker

BACKENDS = ("local", "tensorboard", "mlflow", "wandb")
"""The names ``config.tracking.backends`` accepts."""


def validate_tracking(tracking: Mapping[str, Any]) -> None:
    """Check ``config.tracking``; every error names the key, the value and what is accepted."""
    backends = tuple(tracking.get("backends", ()))
    for backend in backends:
        if backend not in BACKENDS:
            raise ValueError(
                f"config.tracking.backends={backends!r} is invalid: {backend!r} is not a tracker; "
                f"expected a tuple drawn from {BACKENDS}"
            )
    if len(set(backends)) != len(backends):
        raise ValueError(f"config.tracking.backends={backends!r} names a backend twice")
    mode = tracking.get("wandb_mode", "offline")
    if mode not in WANDB_MODES:
        raise ValueError(f"config.tracking.wandb_mode={mode!r} is invalid: expected one of {WANDB_MODES}")
    for key in ("mlflow_uri", "mlflow_experiment", "wandb_project"):
        value = tracking.get(key, "")
        if not isinstance(value, str):
            raise ValueError(f"config.tracking.{key}={value!r} is invalid: expected a string")


def make_trackers(
    tracking: Mapping[str, Any],
    directory: str,
    config: Mapping[str, Any] | None = None,
    run_name: str | None = None,
) -> Trackers:
    """The trackers ``tracking.backends`` names, writing under ``directory`` (a run's
    ``<workdir>/tracking``); ``config`` becomes MLflow params, the W&B run config and a
    TensorBoard text summary. Constructing them writes nothing and imports no backend."""
    validate_tracking(tracking)
    directory = os.path.abspath(directory)
    sinks: list[Tracker] = []
    for backend in tracking.get("backends", ()):
        if backend == "local":
            sinks.append(LocalTracker(directory))
        elif backend == "tensorboard":
            sinks.append(TensorBoardTracker(os.path.join(directory, "tensorboard"), config=config))
        elif backend == "mlflow":
            sinks.append(
                MLflowTracker(
                    tracking.get("mlflow_experiment", "") or "dew",
                    directory=os.path.join(directory, "mlflow"),
                    tracking_uri=tracking.get("mlflow_uri", "") or None,
                    run_name=run_name,
                    params=config,
                )
            )
        elif backend == "wandb":
            sinks.append(
                WandbTracker(
                    tracking.get("wandb_project", "") or "dew",
                    directory=os.path.join(directory, "wandb"),
                    mode=tracking.get("wandb_mode", "offline"),
                    run_name=run_name,
                    config=config,
                )
            )
    return Trackers(sinks)


def _validate_section(section: Any, path: str) -> None:
    try:
        validate_tracking(section)
    except ValueError as e:
        raise ConfigError(str(e)) from None


CONFIG = Section(
    "where metrics and previews are reported",
    {
        "backends": Key(("local",), f"trackers to write to, any of {BACKENDS}", item=str),
        "mlflow_uri": Key("", "MLflow tracking URI ('': an embedded sqlite store under the workdir)"),
        "mlflow_experiment": Key("dew", "MLflow experiment name"),
        "wandb_project": Key("dew", "Weights & Biases project"),
        "wandb_mode": Key("offline", f"Weights & Biases mode, one of {WANDB_MODES} (online needs a key)"),
    },
    validate=_validate_section,
)


__all__ = [
    "BACKENDS",
    "CONFIG",
    "LocalTracker",
    "Logger",
    "LoggingCategory",
    "MLflowTracker",
    "TensorBoardTracker",
    "Tracker",
    "Trackers",
    "WandbTracker",
    "convert_mse_to_rmse",
    "is_writer_process",
    "make_trackers",
    "validate_tracking",
    "write_gif",
    "write_png",
]
