"""A tracker that runs the writer-process machinery and writes nothing: the benchmark's control
for what the processes and pipes alone do to the loop (``tracking.py --control``)."""

from __future__ import annotations

from dew.tracking.background import BackgroundTracker
from dew.tracking.reports import Report


class NullTracker(BackgroundTracker):
    def __init__(self, name: str = "null", writer: str = "process"):
        super().__init__(writer, {"name": name})

    def _open(self) -> None:
        pass

    def _emit(self, batch: list[Report]) -> None:
        pass
