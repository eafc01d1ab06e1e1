"""Run metadata: one JSON file at the run root, beside ``checkpoints/``.

Run-level, not checkpoint-level state, so it is read and written without any checkpoint
manager: reading it can never race a live run's in-flight checkpoint save.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

RUN_METADATA = "run.json"


def save_run_metadata(run_dir: str, metadata: Mapping[str, Any]) -> None:
    """Persist run-level metadata as JSON at the run root, atomically (write, then rename).

    Run-level, not checkpoint-level: it lives beside ``checkpoints/`` and is read and written
    without a checkpoint manager. Any JSON-serialisable dict; the caller decides the contents.
    """
    os.makedirs(run_dir, exist_ok=True)
    text = json.dumps(metadata, indent=2, sort_keys=True)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".run.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(run_dir, RUN_METADATA))


def read_run_metadata(run_dir: str) -> dict[str, Any] | None:
    """Metadata written by ``save_run_metadata``, or None if absent. Never opens a manager, so
    it cannot race a live run's in-flight checkpoint save."""
    path = os.path.join(run_dir, RUN_METADATA)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
