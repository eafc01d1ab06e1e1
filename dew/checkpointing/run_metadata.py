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


class RunMetadataError(ValueError):
    """``run.json`` exists but cannot be read as a JSON object; the message names the file,
    why, and what to do. Input a person can fix (a ``python -m dew.main`` exit status 2)."""


def read_run_metadata(run_dir: str) -> dict[str, Any] | None:
    """Metadata written by ``save_run_metadata``, or None if absent. Never opens a manager, so
    it cannot race a live run's in-flight checkpoint save. A file that is not a JSON object
    (damaged, truncated, unreadable) raises ``RunMetadataError`` naming it."""
    path = os.path.join(run_dir, RUN_METADATA)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            metadata = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: JSONDecodeError and UnicodeDecodeError
        reason = f"{type(e).__name__}: {e}"
    else:
        if isinstance(metadata, dict):
            return metadata
        reason = f"it holds a JSON {type(metadata).__name__}, not an object"
    raise RunMetadataError(
        f"{path} is damaged ({reason}); it holds the run's config and start history. Restore it "
        f"from a copy, or move it aside to go on with a new history (the checkpoints stay usable)"
    )
