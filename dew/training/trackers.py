"""Trackers: where a run's numbers and pictures go.

A tracker receives *reports* (scalars under a logging category, or an artifact) and writes them
somewhere. ``Trackers`` fans one report out to several. Only process 0 writes: reports on other
processes are dropped by design, so a multi-host run logs each value once.

Mean-squared errors are logged as root-mean-squared errors: a key containing ``mse_`` becomes
``rmse_`` with the square root taken *at log time*, after the values were averaged over the
logging window (the root of a mean is not the mean of roots).
"""

from __future__ import annotations

import abc
import enum
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

import numpy as np

from dew.artifacts import ImageGrid


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
    """Keys containing ``mse_`` become ``rmse_`` with the square root of their value."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if "mse_" in key and "rmse_" not in key and isinstance(value, int | float | np.floating | np.integer):
            out[key.replace("mse_", "rmse_")] = math.sqrt(float(value))
        else:
            out[key] = value
    return out


def _is_writer_process() -> bool:
    """Process 0 writes; jax is only asked when it is already imported (no backend opened)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return True
    try:
        return jax.process_index() == 0
    except RuntimeError:
        return True


class Tracker(abc.ABC):
    """A sink for reports. Backends open their run or file on the first value logged."""

    def log(self, category: LoggingCategory, values: Mapping[str, Any], step: int) -> None:
        """Log scalars; mse_* keys arrive here already converted to rmse_*."""
        if values and _is_writer_process():
            self._write_scalars(category, convert_mse_to_rmse(values), int(step))

    def log_artifact(self, name: str, artifact: Any, step: int) -> None:
        if _is_writer_process():
            self._write_artifact(name, artifact, int(step))

    @abc.abstractmethod
    def _write_scalars(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None: ...

    def _write_artifact(self, name: str, artifact: Any, step: int) -> None:  # noqa: B027
        """Backends without media support ignore artifacts."""

    def close(self) -> None:  # noqa: B027
        """Flush and release whatever the tracker opened."""

    def __call__(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None:
        self.log(category, values, step)


class Trackers(Tracker):
    """Fan out without dropping reports; attempt every sink, raise the first failure."""

    def __init__(self, trackers: Iterable[Tracker | Logger] = ()):
        self._sinks: list[Tracker | Logger] = list(trackers)

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


class LocalTracker(Tracker):
    """Writes synchronous reports in a tracking directory, readable with the standard library
    and Pillow: ``scalars.jsonl`` (one JSON object per report), ``images/<name>_<step>.png``."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self._scalars: TextIO | None = None

    @property
    def scalars_path(self) -> str:
        return os.path.join(self.directory, "scalars.jsonl")

    def _write_scalars(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None:
        if self._scalars is None:
            os.makedirs(self.directory, exist_ok=True)
            self._scalars = open(self.scalars_path, "a")  # noqa: SIM115 (kept open across reports)
        record = {"step": step, "category": category.value, **{k: _jsonable(v) for k, v in values.items()}}
        self._scalars.write(json.dumps(record) + "\n")
        self._scalars.flush()

    def _write_artifact(self, name: str, artifact: Any, step: int) -> None:
        if isinstance(artifact, ImageGrid):
            path = os.path.join(self.directory, "images", f"{name}_{step:08d}.png")
            write_png(path, artifact)

    def close(self) -> None:
        if self._scalars is not None:
            self._scalars.close()
            self._scalars = None


def write_png(path: str, grid: ImageGrid, scale: int | None = None) -> str:
    """Save an ImageGrid as one PNG; tiny images are enlarged so a person can see them."""
    from PIL import Image

    h = grid.images.shape[1]
    scale = scale or max(1, 64 // h)
    # A gutter of half a source pixel keeps neighbouring samples from reading as one shape.
    pixels = grid.to_uint8_grid(scale=scale, pad=max(2, scale // 2))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(tmp, format="PNG")
    os.replace(tmp, path)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value


class _NotBuilt(Tracker):
    _backend = ""

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(
            f"{type(self).__name__} is not built yet: the {self._backend} backend lands with the "
            "tracking issue. Use LocalTracker (config.tracking.backends=('local',)) meanwhile."
        )

    def _write_scalars(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None:
        raise NotImplementedError


class TensorBoardTracker(_NotBuilt):
    """A TensorBoard event file in directory, opened on the first value logged into it."""

    _backend = "TensorBoard"


class MLflowTracker(_NotBuilt):
    """An MLflow run in experiment, opened on the first value logged into it."""

    _backend = "MLflow"


class WandbTracker(_NotBuilt):
    """A Weights & Biases run, opened on the first value logged into it."""

    _backend = "Weights & Biases"
