"""``run.json`` as the history of a run's starts, and setting a run's records aside.

``run.json`` (written with ``save_run_metadata``, so atomically) holds::

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
``RunMetadataError`` naming it.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Mapping
from typing import Any

from dew.checkpointing.run_metadata import RUN_METADATA, read_run_metadata, save_run_metadata

#: What a run writes besides checkpoints: set aside together by ``set_aside_records``.
RECORD_DIRS = ("tracking", "previews")


def _version() -> str:
    import dew

    return getattr(dew, "__version__", "unknown")


def starts(workdir: str) -> list[dict[str, Any]]:
    """The recorded starts of the run in ``workdir``, oldest first ([] when there is none). A
    ``run.json`` written before starts were recorded counts as one start of unknown origin."""
    metadata = read_run_metadata(workdir)
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
    previous = read_run_metadata(workdir)
    history = starts(workdir)
    entry = {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "resumed_from": int(resumed_from),
        "config": dict(config),
        "processes": int(processes),
        "dew_version": _version(),
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


__all__ = ["RECORD_DIRS", "record_start", "set_aside_records", "starts", "writer_of"]
