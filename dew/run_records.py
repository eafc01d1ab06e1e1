"""A run's own records, kept at its root beside ``checkpoints/``: ``run.json`` (its config and
the history of its starts) and, set aside together, its ``tracking/`` and ``previews/``.

Run-level, not checkpoint-level state, so ``run.json`` is read and written without any checkpoint
manager: reading it can never race a live run's in-flight checkpoint save. The stix names
``save_run_metadata`` / ``read_run_metadata`` write and read any JSON object there (atomically:
write, then rename); dew's own runs keep their history in it::

    {"label": <workdir name>, "config": <the latest start's config>,
     "starts": [{"time": ISO-8601 UTC, "resumed_from": <step>, "config": {...},
                 "processes": <jax.process_count()>, "dew_version": "..."}, ...]}

One entry per start that got past validation and restore, oldest first, so a failed first
attempt (say ``learning_rate=1e9``) stays visible as history and never passes for the config
of the run. ``config`` at the top is the latest start's, for readers that want "the" config.
The start that wrote checkpoint step S is the last one that resumed from a step below S
(``writer_of``), which is how a resume learns the batch size and process count that the
data position it restores was written with. A resume that finds checkpoints but no ``run.json``
says so and records ``"lost_history": [{"time", "before_step", "reason"}, ...]``: the starts
before ``before_step`` are unknown. A damaged ``run.json`` is never replaced: reading it raises
``RunMetadataError`` naming it, in one line, and so does one whose history is malformed (a key
of the wrong type, a start that is not an object, a negative step, a batch size or process count
that is not a positive int: ``check_history``), so a resume never carries its data position
over by a number that is not one.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from dew.version import __version__

RUN_METADATA = "run.json"
#: What a run writes besides checkpoints: set aside together by ``set_aside_records``.
RECORD_DIRS = ("tracking", "previews")


def save_run_metadata(run_dir: str, metadata: Mapping[str, Any]) -> None:
    """Persist run-level metadata as JSON at the run root, atomically (write, then rename).

    Run-level, not checkpoint-level: it lives beside ``checkpoints/`` and is read and written
    without a checkpoint manager. Any JSON-serialisable dict; the caller decides the contents.
    """
    os.makedirs(run_dir, exist_ok=True)
    text = json.dumps(metadata, indent=2, sort_keys=True)
    path = os.path.join(run_dir, RUN_METADATA)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".run.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:  # a full disk, say: name the file, and leave no temporary file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OSError(e.errno, f"cannot write {path}: {e.strerror or e}") from e


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


def _int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _problem(metadata: Mapping[str, Any]) -> str | None:
    """What is malformed in a run's ``run.json`` (the keys dew reads back), or None."""
    for key in ("label", "dew_version"):
        if metadata.get(key) is not None and not isinstance(metadata[key], str):
            return f"{key} is {metadata[key]!r:.60}, expected a string"
    if "config" in metadata and not isinstance(metadata["config"], dict):
        return f"config is {metadata['config']!r:.60}, expected an object"
    history = metadata.get("starts", [])
    if not isinstance(history, list):
        return f"starts is {history!r:.60}, expected a list of start records"
    for i, entry in enumerate(history):
        where = f"starts[{i}]"
        if not isinstance(entry, dict):
            return f"{where} is {entry!r:.60}, expected an object"
        if not isinstance(entry.get("config"), dict):
            return f"{where}.config is {entry.get('config')!r:.60}, expected an object"
        for key, low in (("resumed_from", 0), ("processes", 1)):
            if entry.get(key) is not None and not _int(entry[key], low):
                return f"{where}.{key} is {entry[key]!r:.60}, expected an int >= {low}"
        for key in ("time", "dew_version"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                return f"{where}.{key} is {entry[key]!r:.60}, expected a string"
        dataset = entry["config"].get("dataset")
        if dataset is not None and not isinstance(dataset, dict):
            return f"{where}.config.dataset is {dataset!r:.60}, expected an object"
        batch = (dataset or {}).get("batch_size")
        if batch is not None and not _int(batch, 1):
            return f"{where}.config.dataset.batch_size is {batch!r:.60}, expected an int >= 1"
    lost = metadata.get("lost_history", [])
    if not isinstance(lost, list):
        return f"lost_history is {lost!r:.60}, expected a list"
    for i, entry in enumerate(lost):
        if not isinstance(entry, dict) or not _int(entry.get("before_step"), 0):
            return f"lost_history[{i}] is {entry!r:.60}, expected an object with before_step, an int >= 0"
    return None


def check_history(workdir: str, metadata: Mapping[str, Any]) -> None:
    """Raise ``RunMetadataError`` (one line, naming the file and the key) when ``metadata``, read
    from ``workdir``'s ``run.json``, is not a run history this module wrote."""
    problem = _problem(metadata)
    if problem is not None:
        raise RunMetadataError(
            f"{os.path.join(workdir, RUN_METADATA)} is malformed: {problem}; it holds the run's config and "
            "start history. Restore it from a copy, or move it aside to go on with a new history (the "
            "checkpoints stay usable)"
        )


def read_run(workdir: str) -> dict[str, Any] | None:
    """``workdir``'s ``run.json`` as a dew run wrote it, checked (``check_history``); None when
    absent. The stix ``read_run_metadata`` reads any JSON object; dew's own readers use this."""
    metadata = read_run_metadata(workdir)
    if metadata is not None:
        check_history(workdir, metadata)
    return metadata


def starts(workdir: str) -> list[dict[str, Any]]:
    """The recorded starts of the run in ``workdir``, oldest first ([] when there is none). A
    ``run.json`` written before starts were recorded counts as one start of unknown origin.
    A malformed one raises ``RunMetadataError`` naming it (``check_history``)."""
    metadata = read_run(workdir)
    if metadata is None:
        return []
    if "starts" in metadata:
        return list(metadata["starts"])
    if "config" in metadata:
        return [{"time": None, "resumed_from": None, "config": metadata["config"], "dew_version": None}]
    return []


def record_start(
    workdir: str,
    config: Mapping[str, Any],
    resumed_from: int,
    *,
    processes: int = 1,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Append this start to ``run.json`` (creating it); return the entry written. ``extra`` are
    run-level keys kept at the top beside ``config`` (e.g. the EMA record ``restore_ema`` reads)."""
    previous = read_run(workdir)
    history = starts(workdir)
    entry = {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "resumed_from": int(resumed_from),
        "config": dict(config),
        "processes": int(processes),
        "dew_version": __version__,
    }
    history.append(entry)
    lost = []
    if previous is None and resumed_from > 0:  # checkpoints without the run.json that went with them
        lost = [
            {"time": entry["time"], "before_step": int(resumed_from), "reason": f"{RUN_METADATA} was missing"}
        ]
        print(
            f"dew: {os.path.join(workdir, RUN_METADATA)} was missing while the run resumes from step "
            f"{resumed_from}: the starts before it are not recorded (noted under 'lost_history' in a new "
            f"{RUN_METADATA}); the data position carries over as if the batch size and process count "
            "were unchanged",
            flush=True,
        )
    previous = previous or {}
    label = previous.get("label") or os.path.basename(os.path.abspath(workdir))
    metadata = {**previous, **dict(extra or {}), "label": label, "config": entry["config"], "starts": history}
    if lost or "lost_history" in previous:
        metadata["lost_history"] = [*previous.get("lost_history", []), *lost]
    save_run_metadata(workdir, metadata)
    return entry


def recorded_kernels(workdir: str) -> dict[str, Any] | None:
    """The kernel decision a run recorded in its ``run.json`` (what a resume keeps), or None: no
    run there yet, or a ``run.json`` the restore reports on its own."""
    if not os.path.isdir(workdir):
        return None
    try:
        return (read_run_metadata(workdir) or {}).get("kernels")
    except (OSError, ValueError):
        return None


def writer_of(workdir: str, step: int) -> dict[str, Any] | None:
    """The recorded start that wrote checkpoint ``step``: the last one that resumed from a step
    below it (None when run.json does not say, e.g. a checkpoint copied in from elsewhere)."""
    for entry in reversed(starts(workdir)):
        resumed_from = entry.get("resumed_from")
        if resumed_from is not None and resumed_from < step:
            return entry
    return None


def set_aside_records(workdir: str) -> str | None:
    """Move the run's records (``tracking/``, ``previews/``) into
    ``<workdir>/superseded/<UTC time>/``, never deleting them; return that directory, or None
    when there was nothing to move. Used when a run starts over in its own workdir."""
    present = [name for name in RECORD_DIRS if os.path.exists(os.path.join(workdir, name))]
    if not present:
        return None
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = os.path.join(workdir, "superseded", stamp)
    os.makedirs(target)
    for name in present:
        shutil.move(os.path.join(workdir, name), os.path.join(target, name))
    return target


__all__ = [
    "RECORD_DIRS",
    "RUN_METADATA",
    "RunMetadataError",
    "check_history",
    "read_run",
    "read_run_metadata",
    "record_start",
    "recorded_kernels",
    "save_run_metadata",
    "set_aside_records",
    "starts",
    "writer_of",
]
