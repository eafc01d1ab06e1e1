"""A tracker's writer in a process of its own, so its Python work never holds the loop's GIL.

A worker *thread* keeps a slow backend's I/O off the loop's path, but not its CPU: MLflow's
SQLAlchemy store spends about 100 us of Python per metric and W&B about 170 us per ``run.log``,
and every microsecond of it is taken from the training loop's thread through the GIL. A writer
process takes that work to another core; the loop only encodes each report (JSON; arrays of
artifacts as ``.npz`` bytes, read back with ``allow_pickle=False``) and writes it to a pipe.

The child is ``python -m dew.tracking.process``, started on the first report (not with
``multiprocessing``, which would re-run an unguarded training script in the child). It rebuilds
the tracker from its class path and keyword arguments and runs the same worker loop a thread
would. It acknowledges flushes, and reports each failure as one JSON line; the parent re-raises
it on the caller's thread (as the builtin exception type it was, else ``RuntimeError``), with
the child's traceback in the message. A child that dies is a failure too. A full pipe blocks
``log`` until the child catches up (back-pressure).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib
import io
import json
import os
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from dew.artifacts import ImageGrid, TextSamples, VideoGrid
from dew.tracking.base import LoggingCategory, is_scalar, to_float

_LENGTH = struct.Struct(">I")
_ARTIFACTS = {"ImageGrid": ImageGrid, "VideoGrid": VideoGrid, "TextSamples": TextSamples}
_ARRAY_FIELDS = {"ImageGrid": ("images",), "VideoGrid": ("clips",), "TextSamples": ("tokens",)}


# --- the wire format --------------------------------------------------------------------------------
def _frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


def _read_frame(stream: BinaryIO) -> bytes | None:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    return stream.read(length)


def encode_report(report: Any) -> bytes:
    """A ScalarReport or ArtifactReport as one or two frames (JSON header, then .npz arrays)."""
    from dew.tracking.reports import ScalarReport

    if isinstance(report, ScalarReport):
        values = {
            k: to_float(v) if is_scalar(v) else {"array": np.asarray(v).tolist()}
            for k, v in report.values.items()
        }
        header = {"t": "s", "c": report.category.value, "s": report.step, "v": values}
        return _frame(json.dumps(header).encode())
    kind = type(report.artifact).__name__
    if kind not in _ARTIFACTS:
        return b""  # backends ignore artifacts they do not know; so does the wire
    fields = {f.name: getattr(report.artifact, f.name) for f in dataclasses.fields(report.artifact)}
    arrays = {name: np.asarray(fields.pop(name)) for name in _ARRAY_FIELDS[kind]}
    npz = io.BytesIO()
    np.savez(npz, **arrays, allow_pickle=False)
    header = {"t": "a", "n": report.name, "s": report.step, "k": kind, "f": fields}
    return _frame(json.dumps(header).encode()) + _frame(npz.getvalue())


def _decode_report(header: dict[str, Any], stream: BinaryIO) -> Any:
    from dew.tracking.reports import ArtifactReport, ScalarReport

    if header["t"] == "s":
        values = {k: np.asarray(v["array"]) if isinstance(v, dict) else v for k, v in header["v"].items()}
        return ScalarReport(LoggingCategory(header["c"]), values, header["s"])
    payload = _read_frame(stream)
    if payload is None:
        raise EOFError("the artifact's arrays did not arrive")
    with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
        fields = dict(header["f"], **{name: arrays[name] for name in arrays.files})
    for key in ("captions", "text"):
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    return ArtifactReport(header["n"], _ARTIFACTS[header["k"]](**fields), header["s"])


# --- the parent's side ------------------------------------------------------------------------------
class ProcessWriter:
    """Starts the child, sends it reports, waits for its flush acknowledgements."""

    def __init__(self, tracker: str, kwargs: dict[str, Any], on_error: Callable[[BaseException], None]):
        self.tracker, self.kwargs, self.on_error = tracker, kwargs, on_error
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._acks: dict[int, threading.Event] = {}
        self._next_ack = 0
        self._lock = threading.Lock()
        self._exited = threading.Event()

    def send(self, report: Any) -> None:
        if self._process is None:
            self._start()
        self._write(encode_report(report))

    def flush(self, stop: bool = False) -> None:
        """Wait until the child has written everything sent before; ``stop`` also ends it."""
        if self._process is None:
            return
        with self._lock:
            ack, self._next_ack = self._next_ack, self._next_ack + 1
            self._acks[ack] = done = threading.Event()
        if not self._exited.is_set():
            self._write(_frame(json.dumps({"t": "stop" if stop else "flush", "id": ack}).encode()))
        while not done.wait(0.1):
            if self._exited.is_set():
                break
        if stop:
            self._close_process()

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "dew.tracking.process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._reader = threading.Thread(target=self._read, name=f"dew-{self.tracker}-reader", daemon=True)
        self._reader.start()
        self._write(
            _frame(json.dumps({"tracker": self.tracker, "kwargs": self.kwargs}, default=str).encode())
        )

    def _write(self, data: bytes) -> None:
        assert self._process is not None and self._process.stdin is not None
        if not data:
            return
        try:
            self._process.stdin.write(data)
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError) as e:
            code = self._process.poll()
            raise RuntimeError(f"the {self.tracker} writer process is gone (exit code {code})") from e

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            if "ack" in message:
                with self._lock:
                    done = self._acks.pop(message["ack"], None)
                if done is not None:
                    done.set()
            elif "error" in message:
                self.on_error(_rebuild(message))
        code = self._process.wait()
        self._exited.set()
        if code != 0:
            self.on_error(RuntimeError(f"the {self.tracker} writer process exited with code {code}"))

    def _close_process(self) -> None:
        assert self._process is not None and self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._process.stdin.close()
        self._process.wait(timeout=120)
        if self._reader is not None:
            self._reader.join(timeout=10)


def _rebuild(message: dict[str, Any]) -> BaseException:
    """The child's exception as the builtin type it was (else RuntimeError), traceback attached."""
    kind = getattr(builtins, message["type"], None)
    text = f"{message['error']}\n--- in the tracker's writer process ---\n{message['traceback']}"
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(text)
        except Exception:
            pass
    return RuntimeError(f"{message['type']}: {text}")


# --- the child's side -------------------------------------------------------------------------------
def main() -> None:
    """Rebuild the tracker, feed its worker loop from stdin, answer on the original stdout."""
    from dew.tracking.reports import Marker

    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # whatever the backend prints goes to stderr, never into the answers
    requests = sys.stdin.buffer
    spec = json.loads(_read_frame(requests) or b"{}")
    module, name = spec["tracker"].split(":")
    tracker = getattr(importlib.import_module(module), name)(**spec["kwargs"], writer="thread")
    lock = threading.Lock()

    def answer(message: dict[str, Any]) -> None:
        with lock:
            answers.write((json.dumps(message) + "\n").encode())

    def forward(error: BaseException) -> None:
        trace = "".join(traceback.format_exception(error))
        answer({"error": str(error), "type": type(error).__name__, "traceback": trace})

    tracker._report_error = forward

    def feed() -> None:
        while True:
            payload = _read_frame(requests)
            if payload is None:  # the parent closed the pipe: drain and stop
                tracker._queue.put(Marker(stop=True))
                return
            message = json.loads(payload)
            if message["t"] in ("flush", "stop"):
                ack = message["id"]
                tracker._queue.put(
                    Marker(stop=message["t"] == "stop", on_done=lambda a=ack: answer({"ack": a}))
                )
                if message["t"] == "stop":
                    return
                continue
            try:
                tracker._queue.put(_decode_report(message, requests))
            except Exception as e:
                forward(e)

    threading.Thread(target=feed, name="dew-tracker-feed", daemon=True).start()
    tracker._work()


if __name__ == "__main__":
    main()
