"""What the writer thread runs for one save of ``Checkpoints``: a persistent step written by the
store, then handed to the run's ``upload`` (``write_persistent``), or this process's local step
(``write_local``); and a reported metric checked to be a number before anything is queued
(``metric_value``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from dew.checkpointing import layout, local
from dew.checkpointing.errors import CheckpointWriteError
from dew.checkpointing.store import Store
from dew.contracts.state import TrainState

Upload = Callable[[str], Any]  # returns None or a future that ``wait`` waits for


def write_persistent(
    store: Store,
    upload: Upload | None,
    step: int,
    state: TrainState,
    rows: Any,
    metrics: Any,
    dataset: Any,
    ema: Mapping[str, Any] | None,
) -> None:
    """Write ``step`` to the persistent tier with its data rows, metrics, dataset state and the
    EMA law it records; then ``upload(path)`` and wait for the future it returns, if any."""
    store.write(step, state, rows, metrics, dataset, layout.law_record(state, ema))
    if upload is not None:
        pending = upload(os.fspath(store.path(step)))
        if pending is not None:
            pending.result()


def write_local(
    local_path: str,
    ema: Mapping[str, Any] | None,
    step: int,
    state: TrainState,
    row: dict[str, np.ndarray] | None,
) -> None:
    """Write this process's shards of ``state`` as the local step ``step`` under ``local_path``
    (in place of the one before it); a write that does not land is a ``CheckpointWriteError``."""
    shards, meta = local.describe(step, state)
    record = layout.law_record(state, ema)
    if record is not None:
        meta["ema"] = record
    try:
        local.write(local_path, step, shards, meta, row)
    except Exception as e:
        raise CheckpointWriteError(f"local checkpoint step {step} did not land in {local_path}: {e}") from e


def metric_value(name: str, value: Any) -> float:
    """A reported metric as a float; anything else is refused, naming it."""
    try:
        return float(np.asarray(jax.device_get(value)))
    except (TypeError, ValueError):
        raise ValueError(f"Checkpoints.save: metric {name!r}={value!r:.80} is not a number") from None
