"""``LocalTracker``: plain files under the run's tracking directory, written synchronously.

Readable with nothing but the standard library and Pillow:

- ``scalars.jsonl``: one JSON object per report, ``{"step", "category", <key>: <value>...}``
  (arrays are stored as nested lists);
- the files ``media.artifact_files`` names for each artifact: ``images/<name>_<step:08d>.png``
  (ImageGrid, captions under the images), ``videos/...gif`` (VideoGrid), ``text/...txt`` and
  ``.html`` (TextSamples), ``scores/...html`` and ``.png`` (TokenScores, heat-coloured),
  ``representations/...png`` and ``.npz`` (Representations: PCA scatter by label, the arrays).

On ``CLEANUP_AFTER_CKPT_RESTORATION`` at step S the rows and files of steps after S (written by
the continuation the restore abandoned) are removed, so the files read as one straight run.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, TextIO

import numpy as np

from dew.training.tracking.base import LoggingCategory, Tracker
from dew.training.tracking.media import artifact_files, write_atomically

_MEDIA_DIRS = ("images", "videos", "text", "scores", "representations")
_STEP_SUFFIX = re.compile(r"_(\d{8,})\.(png|gif|txt|html|npz)$")


class LocalTracker(Tracker):
    """Writes synchronous reports in a tracking directory, readable with the standard library
    and Pillow (see the module docstring for the layout). Nothing exists until the first value."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self._scalars: TextIO | None = None

    @property
    def scalars_path(self) -> str:
        return os.path.join(self.directory, "scalars.jsonl")

    def _write_scalars(self, category: LoggingCategory, values: dict[str, Any], step: int) -> None:
        if category is LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION:
            self._discard_after(step)
            return
        record = {"step": step, "category": category.value, **{k: _jsonable(v) for k, v in values.items()}}
        self._open().write(json.dumps(record) + "\n")
        self._open().flush()

    def _write_artifact(self, name: str, artifact: Any, step: int) -> None:
        for folder, file_name, data in artifact_files(f"{name}_{step:08d}", artifact):
            write_atomically(os.path.join(self.directory, folder, file_name), data)

    def _open(self) -> TextIO:
        if self._scalars is None:
            os.makedirs(self.directory, exist_ok=True)
            self._scalars = open(self.scalars_path, "a")  # noqa: SIM115 (kept open across reports)
        return self._scalars

    def _discard_after(self, step: int) -> None:
        """Drop the rows and media of steps after ``step`` (an abandoned continuation)."""
        self.close()
        if os.path.exists(self.scalars_path):
            with open(self.scalars_path) as f:
                kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
            write_atomically(self.scalars_path, "".join(kept).encode())
        for folder in _MEDIA_DIRS:
            path = os.path.join(self.directory, folder)
            for name in os.listdir(path) if os.path.isdir(path) else ():
                match = _STEP_SUFFIX.search(name)
                if match and int(match.group(1)) > step:
                    os.remove(os.path.join(path, name))

    def close(self) -> None:
        if self._scalars is not None:
            self._scalars.close()
            self._scalars = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    if hasattr(value, "__array__"):  # a jax array that slipped through un-fetched
        return np.asarray(value).tolist()
    return value
