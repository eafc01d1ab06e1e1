"""``BackgroundTracker``: a tracker whose backend writes on a worker (thread or process) of its own.

Slow backends (an MLflow store, a W&B run, an event file) must not sit on the training loop's
critical path: ``log`` only converts the values and puts the report on a bounded queue; one
worker per tracker (a thread, or a process of its own: ``tracking.process``) imports the
backend, opens the run on the first report and writes reports in the order they were logged,
coalescing what arrives within ``linger`` seconds into one batch.

Failures are never swallowed. A report the backend fails to write is recorded, and the first
such failure is raised on the caller's thread at its next ``log``/``log_artifact``/``flush``/
``close`` (later reports are still attempted, so one bad write loses one report, not the run).
``flush`` waits until every report logged before it was written; ``close`` drains the queue,
closes the backend on the worker thread and joins it. When more than ``max_pending`` reports
wait, ``log`` blocks until the worker catches up (back-pressure, not unbounded memory).

Backend objects are created and used only on the worker thread, so a backend need not be
thread-safe.
"""

from __future__ import annotations

import abc
import atexit
import queue
import threading
import time
from typing import Any

from dew.tracking.base import LoggingCategory, Tracker
from dew.tracking.reports import ArtifactReport, Marker, Report, ScalarReport

WRITERS = ("thread", "process")


class BackgroundTracker(Tracker):
    """A tracker that hands reports to a worker, a thread or a process (see the module docstring).

    ``writer="process"`` runs that worker in a process of its own (``tracking.process``), so the
    backend's Python work does not compete with the loop for the GIL; ``kwargs`` are then the
    JSON-able keyword arguments that rebuild this tracker there.

    Subclasses implement ``_open`` (import the backend, open the run), ``_emit`` (write a batch
    of reports in order) and ``_close_backend``; all three run on the worker thread only.
    """

    max_batch = 1000
    linger = 0.25
    """Seconds the worker waits for more reports before writing a batch (a flush does not wait):
    fewer, larger backend calls cost less per report, and a tracker may lag this much."""

    def __init__(
        self, writer: str = "thread", kwargs: dict[str, Any] | None = None, max_pending: int = 10_000
    ):
        if writer not in WRITERS:
            raise ValueError(
                f"{type(self).__name__}: writer={writer!r} is invalid: expected one of {WRITERS}"
            )
        self.writer = writer
        self._kwargs = dict(kwargs or {})
        self._process: Any = None
        self._queue: queue.Queue[Report | Marker] = queue.Queue(max_pending)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._opened = False
        self._closed = False

    # --- caller's thread --------------------------------------------------------------------------
    def _write_scalars(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None:
        self._submit(ScalarReport(category, values, step))

    def _write_artifact(self, name: str, artifact: Any, step: int) -> None:
        self._submit(ArtifactReport(name, artifact, step))

    def flush(self) -> None:
        if self._process is not None:
            self._process.flush()
        elif self._thread is not None and self._thread.is_alive():
            marker = Marker(stop=False)
            self._queue.put(marker)
            marker.done.wait()
        self._raise_pending()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._process is not None:
                self._process.flush(stop=True)
            elif self._thread is not None and self._thread.is_alive():
                marker = Marker(stop=True)
                self._queue.put(marker)
                marker.done.wait()
                self._thread.join()
        self._raise_pending()

    def _submit(self, report: Report) -> None:
        self._raise_pending()
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed; it cannot log step {report.step}")
        if self.writer == "process":
            if self._process is None:
                from dew.tracking.process import ProcessWriter

                path = f"{type(self).__module__}:{type(self).__qualname__}"
                self._process = ProcessWriter(path, self._kwargs, self._report_error)
                atexit.register(self._close_quietly)
            self._process.send(report)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=f"dew-{type(self).__name__}", daemon=True)
            self._thread.start()
            atexit.register(self._close_quietly)
        self._queue.put(report)

    def _raise_pending(self) -> None:
        with self._error_lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _close_quietly(self) -> None:
        """At interpreter exit: drain what a caller forgot to close, without raising."""
        try:
            self.close()
        except Exception as e:
            print(f"dew: {type(self).__name__} failed while closing at exit: {e!r}")

    # --- worker thread ----------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            batch: list[Report] = []
            item = self._queue.get()
            deadline = time.monotonic() + self.linger
            while not isinstance(item, Marker):
                batch.append(item)
                if len(batch) >= self.max_batch:
                    break
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
            if batch:
                self._attempt(self._write_batch, batch)
            if isinstance(item, Marker):
                if item.stop:
                    if self._opened:
                        self._attempt(self._close_backend)
                    self._done(item)
                    return
                self._attempt(self._flush_backend)
                self._done(item)

    @staticmethod
    def _done(marker: Marker) -> None:
        marker.done.set()
        if marker.on_done is not None:
            marker.on_done()

    def _write_batch(self, batch: list[Report]) -> None:
        if not self._opened:
            self._open()
            self._opened = True
        self._emit(batch)

    def _attempt(self, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except Exception as e:
            self._report_error(e)

    def _report_error(self, error: BaseException) -> None:
        """Keep the first failure for the caller's thread (a writer process forwards it)."""
        with self._error_lock:
            self._error = self._error or error

    # --- backend hooks (worker thread) ------------------------------------------------------------
    @abc.abstractmethod
    def _open(self) -> None:
        """Import the backend and open the run or file; called before the first batch."""

    @abc.abstractmethod
    def _emit(self, batch: list[Report]) -> None:
        """Write ``batch`` (reports in the order logged)."""

    def _flush_backend(self) -> None:
        """Make what was written durable (called on flush)."""

    def _close_backend(self) -> None:
        """Finish the run and release the backend (called once, on close, if it was opened)."""
