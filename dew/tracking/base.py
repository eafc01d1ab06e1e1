"""The tracker contract: logging categories, ``Tracker``, the ``Trackers`` fan-out, mse -> rmse.

A tracker receives *reports*: scalars under a logging category (``log``), or an artifact
(``log_artifact``). Only process 0 writes; reports made on other processes are dropped here, by
design, so a multi-host run logs every value once and no two hosts race on one file or run.

Categories (what a sink may rely on):

- ``TRAIN_METRICS``, ``EVAL_METRICS``, ``TEST_METRICS``: averages over a window of steps, keyed
  by metric name. Backends with one namespace prefix the key with the category value
  (``train/loss``, ``eval/loss``).
- ``SYSTEM_METRICS``: this process's runtime and throughput (``steps_per_sec``, ...).
- ``BEST_MODEL``: sent when a checkpoint becomes the best one so far; ``values`` describe it
  (e.g. ``{"step": 1200, "eval_loss": 0.031}``) and ``step`` is the training step of the report.
  Backends record it as scalars under ``best_model/`` and, where they have one, in the run summary.
- ``CLEANUP_AFTER_CKPT_RESTORATION``: sent once after a checkpoint was restored, with ``step``
  the restored step (``values`` may be empty). Anything a sink wrote for steps after it belongs
  to the abandoned continuation; each sink discards or marks it (see each backend).

Mean-squared errors are logged as root-mean-squared errors: a key containing ``mse_`` becomes
``rmse_`` with the square root taken *at log time*, after the values were averaged over the
logging window (the root of a mean is not the mean of roots).
"""

from __future__ import annotations

import abc
import enum
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np


class LoggingCategory(enum.Enum):
    """What kind of data a report carries, so a sink can route or format it."""

    BEST_MODEL = "best_model"
    TRAIN_METRICS = "train"
    EVAL_METRICS = "eval"
    TEST_METRICS = "test"
    SYSTEM_METRICS = "system"
    CLEANUP_AFTER_CKPT_RESTORATION = "cleanup_after_ckpt_restoration"


Logger = Callable[[LoggingCategory, dict[str, Any], int], None]
"""A plain logging callback: (category, values, step) -> None."""


def convert_mse_to_rmse(values: Mapping[str, Any]) -> dict[str, Any]:
    """Keys containing ``mse_`` become ``rmse_`` with the square root of their value: a number's
    root, or an array's element by element (a per-channel MSE becomes a per-channel RMSE, as a
    NumPy array). Non-numeric values under such a key are kept as they are.

    Applied at log time, to values already averaged over the logging window: the square root
    must come after the mean.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        if "mse_" in key and "rmse_" not in key and is_scalar(value):
            out[key.replace("mse_", "rmse_")] = math.sqrt(to_float(value))
        elif "mse_" in key and "rmse_" not in key and _is_numeric_array(value):
            out[key.replace("mse_", "rmse_")] = np.sqrt(np.asarray(value))
        else:
            out[key] = value
    return out


def _is_numeric_array(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return hasattr(value, "shape") and dtype is not None and np.dtype(dtype).kind in "fiu"


def is_scalar(value: Any) -> bool:
    """A number: Python, NumPy, or a one-element (NumPy or JAX) array; logged as a scalar.
    Arrays of more than one element are distributions (histograms where a backend has them)."""
    if isinstance(value, int | float | np.number):
        return True
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    return (
        shape is not None and dtype is not None and math.prod(shape) == 1 and np.dtype(dtype).kind in "fiub"
    )


def to_float(value: Any) -> float:
    """The Python float of a value ``is_scalar`` accepts."""
    return float(np.asarray(value).reshape(()))


def is_writer_process() -> bool:
    """Process 0 writes; jax is only asked when it is already imported (no backend opened)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return True
    try:
        return jax.process_index() == 0
    except RuntimeError:
        return True


def tag(category: LoggingCategory, key: str) -> str:
    """The key a one-namespace backend (TensorBoard, MLflow, W&B) stores a value under."""
    return f"{category.value}/{key}"


class Tracker(abc.ABC):
    """A sink for reports. Backends open their run or file on the first value logged.

    ``log`` and ``log_artifact`` drop reports on processes other than 0 and convert ``mse_*`` to
    ``rmse_*``; subclasses implement ``_write_scalars`` (every category arrives there, including
    ``BEST_MODEL`` and ``CLEANUP_AFTER_CKPT_RESTORATION``) and optionally ``_write_artifact``.
    ``flush`` returns once everything logged so far is written; ``close`` flushes and releases.
    """

    def log(self, category: LoggingCategory, values: Mapping[str, Any], step: int) -> None:
        """Log scalars (and arrays, which backends with histograms record as histograms)."""
        if (values or category is LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION) and is_writer_process():
            self._write_scalars(category, convert_mse_to_rmse(values), int(step))

    def log_artifact(self, name: str, artifact: Any, step: int) -> None:
        """Log an ImageGrid, VideoGrid or TextSamples as the backend's natural media."""
        if is_writer_process():
            self._write_artifact(name, artifact, int(step))

    @abc.abstractmethod
    def _write_scalars(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None: ...

    def _write_artifact(self, name: str, artifact: Any, step: int) -> None:  # noqa: B027
        """Backends without media support ignore artifacts."""

    def flush(self) -> None:  # noqa: B027
        """Return once every report logged so far is written (synchronous trackers: at once)."""

    def close(self) -> None:  # noqa: B027
        """Flush and release whatever the tracker opened."""

    def __call__(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None:
        self.log(category, values, step)


class Trackers(Tracker):
    """Fan out without dropping reports; attempt every sink, raise the first failure.

    Sinks are Trackers or plain logger callbacks ``(category, values, step) -> None`` attached
    with ``attach`` (the console loggers ``log_metrics_to_line``/``log_metrics_to_table`` are
    such callbacks). Callbacks see every category and the values as logged (they convert
    ``mse_*`` themselves if they display them). A broken sink never stops the others: each
    report reaches every sink, and the first exception is raised after all were tried.
    """

    def __init__(self, trackers: Iterable[Tracker | Logger] = ()):
        self._sinks: list[Tracker | Logger] = list(trackers)

    @property
    def sinks(self) -> tuple[Tracker | Logger, ...]:
        return tuple(self._sinks)

    def attach(self, logger: Tracker | Logger) -> None:
        """Add a sink: a Tracker or a plain (category, values, step) callback."""
        self._sinks.append(logger)

    def log(self, category: LoggingCategory, values: Mapping[str, Any], step: int) -> None:
        values = dict(values)
        self._each(lambda sink: sink(category, values, step))

    def log_artifact(self, name: str, artifact: Any, step: int) -> None:
        self._each(
            lambda sink: sink.log_artifact(name, artifact, step) if isinstance(sink, Tracker) else None
        )

    def flush(self) -> None:
        self._each(lambda sink: sink.flush() if isinstance(sink, Tracker) else None)

    def close(self) -> None:
        self._each(lambda sink: sink.close() if isinstance(sink, Tracker) else None)

    def _write_scalars(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None:
        raise AssertionError("Trackers.log fans out directly")

    def _each(self, call: Callable[[Any], None]) -> None:
        first: BaseException | None = None
        for sink in self._sinks:
            try:
                call(sink)
            except Exception as e:  # every sink is attempted; the first failure wins.
                first = first or e
        if first is not None:
            raise first
