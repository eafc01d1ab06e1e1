"""A protocol draw's progress file (FID's ``<outdir>/fid-progress.npz``, ADM's suite's
``adm-progress.npz``): written after every chunk, read back on a rerun, and never trusted further
than it can be checked. What a draw keeps in it is its tally's (``dew.scoring.fid_progress``).

A draw of ``num`` images in chunks of ``chunk`` records, after its k-th chunk, the float64 sums
of every feature row so far (``MomentSums``: ``count``, ``total`` Σ f [D], ``outer`` Σ f fᵀ
[D, D]), ``chunks_done`` = k, the draw's settings (a JSON object), any ``extra`` arrays
(``write_progress(..., extra=...)``) and ``digest``, the SHA-256 of all of these
(``dew.pinned_weights.content_sha256``: every name, dtype, shape and byte).

``read_progress`` / ``read_progress_arrays`` refuse, in one line naming the file and ending
"delete it to start over", a file that is not an ``.npz``, lacks or adds an array, holds an
array of another dtype or shape (an object array included: never unpickled), settings that are
not a JSON object, contents that do not match the digest, counts that disagree with each other
or with the settings (1 ≤ ``chunks_done`` ≤ ⌈num/chunk⌉, ``count`` = min(``chunks_done``·``chunk``,
num)), sums of another feature width than the detector's, sums that are not finite, or what the
caller's ``check`` of the extra arrays refuses. A file whose digest holds but whose settings are
another draw's is refused naming the settings that differ. So a resumed draw either continues
exactly where the file says, or does not start: the published numbers are never computed from
sums the file does not vouch for. Damage (everything but another draw's settings) is
``ProgressDamaged``; a draw sets such a file aside (``set_aside``: renamed
``<name>.damaged-<UTC time>``, one line on stderr) and starts over, so a damaged file dew wrote
never stops a run. Every array is read through ``dew.npz.read_npz``: its dtype and shape checked
against the layout, its size bounded by the draw's settings and the detector's width before it
is allocated, its CRC-32 checked.

Progress is written to ``<name>.tmp-<pid>`` and renamed over the old file; a process killed
between the two leaves the temporary file behind, and ``remove_stale_temporaries`` (called by the
next draw on the same ``outdir``) removes those of processes no longer alive.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dew.npz import Member, NotAnNpzError, read_npz
from dew.pinned_weights import content_sha256
from dew.scoring.fid_reference import FidInputError, MomentSums

PROGRESS_FILE = "fid-progress.npz"  # FID's, the default name
_ARRAYS = ("settings", "chunks_done", "count", "total", "outer")
_DIGEST = "digest"


def fingerprint(settings: dict[str, Any]) -> str:
    """The settings as the progress file stores them: JSON, keys sorted."""
    return json.dumps(settings, sort_keys=True, default=str)


def _arrays(settings: dict[str, Any], chunks_done: int, sums: MomentSums) -> dict[str, np.ndarray]:
    return {
        "settings": np.asarray(fingerprint(settings)),
        "chunks_done": np.asarray(chunks_done, np.int64),
        "count": np.asarray(sums.count, np.int64),
        "total": np.asarray(sums.total, np.float64),
        "outer": np.asarray(sums.outer, np.float64),
    }


def write_progress(
    outdir: str,
    settings: dict[str, Any],
    chunks_done: int,
    sums: MomentSums,
    *,
    extra: dict[str, np.ndarray] | None = None,
    name: str = PROGRESS_FILE,
) -> None:
    """The sums (and ``extra`` arrays) after ``chunks_done`` chunks with their digest, written
    atomically as ``<outdir>/<name>`` (a temporary file, flushed to disk, then renamed over the
    old one)."""
    arrays = _arrays(settings, chunks_done, sums)
    clash = set(arrays) & set(extra or {}) | {_DIGEST} & set(extra or {})
    if clash:
        raise ValueError(f"write_progress: extra arrays {sorted(clash)} would replace the file's own")
    arrays.update(extra or {})
    path = os.path.join(outdir, name)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays, **{_DIGEST: np.asarray(content_sha256(arrays))}, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _expected(dim: int | None, settings: dict[str, Any]) -> dict[str, Member]:
    """The progress file's own arrays; their bytes bounded by what a draw can write: settings'
    JSON as long as these (4 bytes a character) but for values such as a path (another draw's
    are refused naming them: ``PATH_MAX`` more characters), one SHA-256 digest, sums of the
    detector's width."""
    return {
        "settings": Member("U", (), max_bytes=4 * (len(fingerprint(settings)) + 4096)),
        "chunks_done": Member("i", ()),
        "count": Member("i", ()),
        "total": Member("f", ("D",) if dim is None else (dim,)),
        "outer": Member("f", ("D", "D") if dim is None else (dim, dim)),
        _DIGEST: Member("U", (), max_bytes=4 * 64),
    }


class ProgressDamaged(FidInputError):
    """The progress file is damaged or inconsistent (not another draw's): ``set_aside`` moves it
    out of the way and the draw starts over. ``path`` is the file."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def set_aside(damaged: ProgressDamaged) -> str:
    """Rename the damaged progress file to ``<name>.damaged-<UTC time>[-<n>]`` and say so on stderr in
    one line; returns the new name (the old one when another process set it aside first)."""
    import datetime
    import sys

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    aside, n = f"{damaged.path}.damaged-{stamp}", 0
    while os.path.exists(aside):  # one set aside earlier this second is kept too
        n += 1
        aside = f"{damaged.path}.damaged-{stamp}-{n}"
    try:
        os.replace(damaged.path, aside)
    except FileNotFoundError:  # another process of the draw set it aside already
        return damaged.path
    reason = str(damaged).removesuffix("; delete it to start over")
    print(f"fid: {reason}; set it aside as {aside} and drawing from the start", file=sys.stderr, flush=True)
    return aside


def _read_arrays(path: str, refuse, schema: dict[str, Member], what: str) -> dict[str, np.ndarray]:
    try:
        arrays = read_npz(path, f"the {what} progress file", schema)
    except NotAnNpzError as e:
        reason = str(e).split(f"{path}", 1)[-1].lstrip(": ")
        raise refuse(reason if reason.startswith("member") else f"it {reason}") from None
    return {k: v for k, v in arrays.items() if isinstance(v, np.ndarray)}


def read_progress(outdir: str, settings: dict[str, Any], dim: int | None = None) -> tuple[int, MomentSums]:
    """(chunks done, their sums) from ``outdir``'s progress file, (0, empty) without one.

    ``settings`` are the draw's (with ``num_images`` and ``chunk``), ``dim`` the detector's
    feature width (None: not checked). ``FidInputError`` in one line naming the file when it is
    damaged or inconsistent (module docstring), or was made with other settings."""
    chunks, sums, _ = read_progress_arrays(outdir, settings, dim)
    return chunks, sums


Check = Callable[[int, dict[str, np.ndarray]], str | None]


def read_progress_arrays(
    outdir: str,
    settings: dict[str, Any],
    dim: int | None = None,
    *,
    name: str = PROGRESS_FILE,
    what: str = "FID",
    extra: dict[str, Member] | None = None,
    check: Check | None = None,
) -> tuple[int, MomentSums, dict[str, np.ndarray]]:
    """``read_progress`` of ``<outdir>/<name>`` holding also the ``extra`` arrays (name ->
    ``dew.npz.Member``: dtype kinds, shape, bytes): (chunks done, their sums, the extra arrays);
    (0, empty, {}) without the file. After the file's own checks, ``check(chunks_done, extra
    arrays)`` gives a reason to refuse it (or None). Refusals name the ``what`` progress file;
    damage (everything but another draw's settings) is ``ProgressDamaged``."""
    path = os.path.join(outdir, name)
    if not os.path.exists(path):
        return 0, MomentSums(), {}

    def refuse(reason: str) -> ProgressDamaged:
        return ProgressDamaged(
            f"--outdir={outdir!r}: the {what} progress file {path} is unusable: {reason}; "
            "delete it to start over",
            path,
        )

    extra = dict(extra or {})
    schema = {**_expected(dim, settings), **extra}
    data = _read_arrays(path, refuse, schema, what)
    arrays = {k: data[k] for k in schema if k != _DIGEST}
    if content_sha256(arrays) != str(data[_DIGEST]):
        raise refuse("its arrays do not match the digest it records (damaged or edited)")
    stored = str(data["settings"])
    try:
        old = json.loads(stored)
    except ValueError:
        old = None
    if not isinstance(old, dict):
        raise refuse(f"its settings are not a JSON object ({stored[:60]!r})")
    if stored != fingerprint(settings):
        new = json.loads(fingerprint(settings))
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        was = ", ".join(f"{k}={old.get(k)!r}" for k in diff)
        now = ", ".join(f"{k}={new.get(k)!r}" for k in diff)
        raise FidInputError(
            f"--outdir={outdir!r} holds a draw with other settings ({was}; now {now}); "
            f"use another --outdir or delete {name}"
        )
    chunks, count = int(data["chunks_done"]), int(data["count"])
    total, outer = data["total"].astype(np.float64), data["outer"].astype(np.float64)
    num, chunk = int(settings["num_images"]), int(settings["chunk"])
    num_chunks = math.ceil(num / chunk)
    if not 1 <= chunks <= num_chunks:
        raise refuse(f"chunks_done={chunks}, expected 1..{num_chunks} ({num} images in chunks of {chunk})")
    if count != min(chunks * chunk, num):
        raise refuse(
            f"count={count} images after {chunks} chunks of {chunk}, expected {min(chunks * chunk, num)}"
        )
    if total.ndim != 1 or outer.shape != (total.shape[0],) * 2:
        raise refuse(f"total {total.shape} and outer {outer.shape} are not [D] and [D, D]")
    if not (np.isfinite(total).all() and np.isfinite(outer).all()):
        raise refuse("its sums are not finite")
    extras = {k: data[k] for k in extra}
    reason = check(chunks, extras) if check is not None else None
    if reason:
        raise refuse(reason)
    return chunks, MomentSums(count, total, outer), extras


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(outdir: str, names: tuple[str, ...] = (PROGRESS_FILE,)) -> list[str]:
    """Remove ``<name>.tmp-<pid>`` files in ``outdir`` left by processes that are no longer
    alive on this host (a draw killed between writing and renaming); returns what was removed.
    A temporary file of a live process (another draw writing now) is left alone."""
    removed = []
    if not os.path.isdir(outdir):
        return removed
    for entry in sorted(os.listdir(outdir)):
        for name in names:
            prefix = f"{name}.tmp-"
            if not entry.startswith(prefix):
                continue
            pid = entry[len(prefix) :]
            if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
                continue
            try:
                os.remove(os.path.join(outdir, entry))
                removed.append(entry)
            except FileNotFoundError:
                pass
    return removed


__all__ = [
    "PROGRESS_FILE",
    "ProgressDamaged",
    "fingerprint",
    "read_progress",
    "read_progress_arrays",
    "remove_stale_temporaries",
    "set_aside",
    "write_progress",
]
