"""``LocalTracker``: plain files under the run's tracking directory, written synchronously.

Readable with nothing but the standard library and Pillow:

- ``scalars.jsonl``: one JSON object per report, ``{"step", "category", <key>: <value>...}``
  (arrays are stored as nested lists);
- the files ``media.artifact_files`` names for each artifact: ``images/<name>_<step:08d>.png``
  (ImageGrid, captions under the images), ``videos/...gif`` (VideoGrid), ``text/...txt`` and
  ``.html`` (TextSamples), ``scores/...html`` and ``.png`` (TokenScores, heat-coloured),
  ``representations/...png`` and ``.npz`` (Representations: PCA scatter by label, the arrays).

Crash safety: each row is appended with one ``write`` of the whole line, so a kill leaves at most
one torn line, the last. A power loss or a full disk can leave the same (or zero bytes) at the
end. Before its first append the tracker checks the end of ``scalars.jsonl`` and trims a last line
that is not one whole JSON object, saying so on stderr; rows that do not parse anywhere else in
the file are moved to ``scalars.jsonl.damaged`` when the file is rewritten. No damaged line ever
stops a run.

On ``CLEANUP_AFTER_CKPT_RESTORATION`` at step S the rows and files of steps after S (written by
the continuation the restore abandoned, or by a run killed before its first checkpoint when S is
0) are removed, so the files read as one straight run.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

import numpy as np

from dew.tracking.base import LoggingCategory, Tracker
from dew.tracking.media import artifact_files, write_atomically

_MEDIA_DIRS = ("images", "videos", "text", "scores", "representations")
_STEP_SUFFIX = re.compile(r"_(\d{8,})\.(png|gif|txt|html|npz)$")
#: How far back from the end of ``scalars.jsonl`` the torn-line check reads (one row is far less).
_TAIL_BYTES = 1 << 20


class TrackingWriteError(RuntimeError):
    """A report could not be written (the cause, e.g. a full disk, is chained)."""


class LocalTracker(Tracker):
    """Writes synchronous reports in a tracking directory, readable with the standard library
    and Pillow (see the module docstring for the layout and the crash-safety contract). Nothing
    exists until the first value."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self._fd: int | None = None

    @property
    def scalars_path(self) -> str:
        return os.path.join(self.directory, "scalars.jsonl")

    def _write_scalars(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None:
        if category is LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION:
            self._discard_after(step)
            return
        record = {"step": step, "category": category.value, **{k: _jsonable(v) for k, v in values.items()}}
        try:
            _write_all(self._open(), (json.dumps(record) + "\n").encode())
        except OSError as e:  # e.g. a full disk: name the file, keep the cause
            raise TrackingWriteError(
                f"tracking: could not append the {category.value} row of step {step} to {self.scalars_path}"
            ) from e

    def _write_artifact(self, name: str, artifact: Any, step: int) -> None:
        for folder, file_name, data in artifact_files(f"{name}_{step:08d}", artifact):
            write_atomically(os.path.join(self.directory, folder, file_name), data)

    def _open(self) -> int:
        if self._fd is None:
            os.makedirs(self.directory, exist_ok=True)
            trim_torn_tail(self.scalars_path)
            self._fd = os.open(self.scalars_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _discard_after(self, step: int) -> None:
        """Drop the rows and media of steps after ``step`` (an abandoned continuation)."""
        self.close()
        if os.path.exists(self.scalars_path):
            trim_torn_tail(self.scalars_path)
            rows, damaged = read_rows(self.scalars_path)
            kept = [line for line, row in rows if row["step"] <= step]
            if damaged:
                with open(self.scalars_path + ".damaged", "ab") as f:
                    f.write(b"".join(damaged))
                print(
                    f"dew: {self.scalars_path}: moved {len(damaged)} unreadable row(s) to "
                    f"{os.path.basename(self.scalars_path)}.damaged",
                    file=sys.stderr,
                )
            if damaged or len(kept) != len(rows):
                write_atomically(self.scalars_path, b"".join(kept))
        for folder in _MEDIA_DIRS:
            path = os.path.join(self.directory, folder)
            for name in os.listdir(path) if os.path.isdir(path) else ():
                match = _STEP_SUFFIX.search(name)
                if match and int(match.group(1)) > step:
                    os.remove(os.path.join(path, name))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_rows(path: str) -> tuple[list[tuple[bytes, dict[str, Any]]], list[bytes]]:
    """The rows of a ``scalars.jsonl`` as ``(line, parsed)`` pairs, and the lines that are not a
    whole JSON object with an int ``step`` (torn, zero-filled or otherwise damaged)."""
    rows: list[tuple[bytes, dict[str, Any]]] = []
    damaged: list[bytes] = []
    with open(path, "rb") as f:
        for line in f:
            row = _parse(line)
            if row is None:
                if line.strip(b"\0 \t\r\n"):  # blank or zero-filled tails carry nothing to keep
                    damaged.append(line if line.endswith(b"\n") else line + b"\n")
            else:
                rows.append((line, row))
    return rows, damaged


def trim_torn_tail(path: str) -> int:
    """Cut a last line that is not one whole JSON row (no newline, or not parseable) off
    ``path``; return how many bytes were cut (0 when the file ends cleanly or does not exist)."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        start = max(0, size - _TAIL_BYTES)
        f.seek(start)
        tail = f.read()
        body = tail.rstrip(b"\0") if tail.endswith(b"\0") else tail
        if body.endswith(b"\n"):
            last_start = body.rfind(b"\n", 0, len(body) - 1) + 1
            if _parse(body[last_start:]) is not None:
                if len(body) == len(tail):
                    return 0
                cut = start + len(body)  # zero bytes after the last whole row
            else:
                cut = start + last_start
        else:
            cut = start + body.rfind(b"\n") + 1 if b"\n" in body else start
        f.truncate(cut)
    print(
        f"dew: {path}: trimmed a torn last row ({size - cut} bytes) left by an interrupted write",
        file=sys.stderr,
    )
    return size - cut


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    ok = isinstance(row, dict) and isinstance(row.get("step"), int) and "category" in row
    return row if ok and line.endswith(b"\n") else None


def _write_all(fd: int, data: bytes) -> None:
    """One ``write`` for the whole row (an O_APPEND write of a small buffer is not interleaved);
    the loop only continues after a short write, which a full disk can cause."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    if hasattr(value, "__array__"):  # a jax array that slipped through un-fetched
        return np.asarray(value).tolist()
    return value
