"""What a tracker's worker is handed: the reports ``log``/``log_artifact`` queue, and the markers
``flush``/``close`` put behind them. Shared by the worker thread (``tracking.background``) and the
worker process (``tracking.process``)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from dew.tracking.base import LoggingCategory


@dataclasses.dataclass(frozen=True)
class ScalarReport:
    category: LoggingCategory
    values: dict[str, Any]
    step: int


@dataclasses.dataclass(frozen=True)
class ArtifactReport:
    name: str
    artifact: Any
    step: int


Report = ScalarReport | ArtifactReport


@dataclasses.dataclass
class Marker:
    """A flush or stop request: the worker sets ``done`` (and calls ``on_done``) once everything
    before it is written."""

    stop: bool
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    on_done: Any = None


__all__ = ["ArtifactReport", "Marker", "Report", "ScalarReport"]
