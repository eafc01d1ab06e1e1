"""The dots decision's cache files (``dew.runtime.cpu.dots``): where they are, read as hints.

A decision measured on this machine is kept twice as JSON: in the workdir (``cache_path``) and
for the whole machine (``machine_cache_path``, beside the machine's compiled programs). Both
files are hints, never trusted: ``read_cache`` keeps only well-formed entries
(``valid_dot_decision``, ``valid_dot_shapes``) and says in one line, naming the file, what it set
aside, so the caller measures that again and replaces it; ``_remember`` writes atomically, leaves
no temporary file behind, and says once per file when one cannot be written. The parts that
files written by earlier versions hold besides (``decisions``, ``shapes``: convolutions once
timed per shape class) are left unread.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from dew.runtime import compilation_cache

CACHE_FILE = "kernel_choice.json"
#: Relative margin within which a default (YNNPACK, XLA's gradients, XLA's dots) is kept over a
#: faster candidate.
TIE = 0.02


def _empty() -> dict:
    return {part: {} for part in PARTS}


def digest(value: Any) -> str:
    """A short digest of a JSON value (sorted keys): a cache key."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _classes_of(value: Any, width: int) -> list[tuple[int, ...]]:
    """``value`` as a list of int tuples of ``width`` (>= 0, the first one >= 1), or ValueError."""
    if not isinstance(value, list) or not value:
        raise ValueError("expected a non-empty list of shape classes")
    out = []
    for row in value:
        if (
            not isinstance(row, list)
            or len(row) != width
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row)
        ):
            raise ValueError(f"shape class {row!r} is not {width} ints >= 0")
        out.append(tuple(row))
    return out


def _batched(entry: Any, what: str) -> dict:
    """``entry`` when it is an object with a ``batch`` int >= 1, else ValueError naming ``what``."""
    if not isinstance(entry, dict):
        raise ValueError(f"{what} is a {type(entry).__name__}, not an object")
    batch = entry.get("batch")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"{what} has batch {batch!r}, not an int >= 1")
    return entry


def _counts(entry: Any, what: str, width: int) -> dict:
    """The ``counts`` of a measured entry (``what``): class (JSON of ``width`` ints) -> uses >= 1,
    non-empty; else ValueError."""
    if not isinstance(entry, dict):
        raise ValueError(f"{what} is a {type(entry).__name__}, not an object")
    counts = entry.get("counts")
    if not isinstance(counts, dict) or not counts:
        raise ValueError(f"{what} has no 'counts' object")
    for name, uses in counts.items():
        try:
            _classes_of([json.loads(name)], width)
        except ValueError as e:
            raise ValueError(f"{what} counts {name!r}: {e}") from None
        if not isinstance(uses, int) or isinstance(uses, bool) or uses < 1:
            raise ValueError(f"{what} counts {uses!r} uses of {name}")
    return counts


def _seconds(value: Any) -> bool:
    """Whether ``value`` is a time: a number >= 0 (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def valid_dot_shapes(entry: Any) -> dict:
    """A traced matrix-products entry (``{"batch": B >= 1, "dots": [[b, m, k, n, split, uses],
    ...]}``, ``dew.training.traced_dots.trace_dots``) as it is, or ValueError saying what is wrong."""
    for row in _classes_of(_batched(entry, "a dots entry").get("dots"), 6):
        if row[4] > 2 or row[5] < 1:
            raise ValueError(f"matrix-product class {list(row)!r} has split {row[4]} or uses {row[5]}")
    return entry


def valid_dot_decision(entry: Any) -> dict:
    """A measured dots entry (``counts``: class -> uses; ``times``: route (``xla``, ``onednn``) ->
    class -> s, XLA's present and every counted class timed; optional ``unused``: route -> why)
    as it is, or ValueError."""
    counts, times = _counts(entry, "a dots decision", 5), entry.get("times")
    if not isinstance(times, dict) or "xla" not in times:
        raise ValueError("a dots decision has no times of XLA's dots")
    for route, rows in times.items():
        if route not in ("xla", "onednn") or not isinstance(rows, dict):
            raise ValueError(f"a dots decision times route {route!r} as {type(rows).__name__}")
        for name in counts:
            if not _seconds(rows.get(name)):
                raise ValueError(f"a dots decision has no time of {route} for class {name}")
    unused = entry.get("unused", {})
    if not isinstance(unused, dict) or any(
        route != "onednn" or not isinstance(why, str) for route, why in unused.items()
    ):
        raise ValueError(f"a dots decision's 'unused' is {unused!r}, not an object of routes and reasons")
    return entry


#: Each part of the cache and the check its entries pass when read.
_VALIDATORS = {
    "dot_decisions": valid_dot_decision,
    "dot_shapes": valid_dot_shapes,
}
PARTS = tuple(_VALIDATORS)


def read_cache(path: str | None, log: Callable[[str], None] | None = None) -> dict:
    """The cache file at ``path`` as ``{part: {...}}`` for every part of ``PARTS``, keeping only
    the entries that are well formed (``valid_dot_decision``, ``valid_dot_shapes``). A cache is a
    hint: a file that cannot be read, is not such an object or holds malformed entries is never an
    error; it is said in one line naming the file (``log``),
    and what it lacks is measured again and replaced. No file (or no ``path``): empty, silently."""
    if path is None or not os.path.lexists(path):
        return _empty()

    def set_aside(why: str) -> dict:
        if log is not None:
            log(f"the kernel cache {path} is unusable ({why}): measuring again and replacing it")
        return _empty()

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return set_aside(f"{type(e).__name__}: {e}")
    if not isinstance(data, dict):
        return set_aside(f"a JSON {type(data).__name__}, not an object")
    out, dropped = _empty(), []
    for part, check in _VALIDATORS.items():
        entries = data.get(part, {})
        if not isinstance(entries, dict):
            dropped.append(f"its {part!r} is a JSON {type(entries).__name__}, not an object")
            continue
        for key, entry in entries.items():
            try:
                out[part][key] = check(entry)
            except ValueError as e:
                dropped.append(str(e))
    if dropped and log is not None:
        more = f"; {len(dropped) - 1} more" if len(dropped) > 1 else ""
        log(f"the kernel cache {path} has malformed entries ({dropped[0]}{more}): measuring again")
    return out


def write_cache(path: str, data: Mapping[str, Any]) -> None:
    """Write atomically (a concurrent reader sees the old file or the new one); the temporary
    file never outlives a failed write. Raises OSError."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kernel_choice.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def writable(path: str) -> bool:
    """Whether the directory of the cache file ``path`` can be made, if need be, and written:
    checked before anything is measured (a workdir that cannot be written stops the run anyway)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK)


def cache_path(workdir: str | None) -> str | None:
    """The workdir's copy of the decisions, ``<workdir>/cache/kernel_choice.json``; None without
    a workdir (the machine's copy serves)."""
    return None if workdir is None else os.path.join(workdir, "cache", CACHE_FILE)


MACHINE_CACHE_VARIABLE = compilation_cache.MACHINE_VARIABLE


def machine_cache_path(environ: Mapping[str, str] | None = None) -> str | None:
    """The machine's own copy of the decisions, shared by every workdir on it (a decision is a
    fact about the CPU, jaxlib and shapes, not about one run): ``CACHE_FILE`` in the machine's
    dew folder (``compilation_cache.machine_directory``: ``$DEW_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/dew``, else ``~/.cache/dew``). ``DEW_CACHE_DIR=off`` (or empty) keeps
    decisions in the workdir only."""
    directory = compilation_cache.machine_directory(environ)
    return None if directory is None else os.path.join(directory, CACHE_FILE)


def stamped(entry: Mapping[str, Any], started: float) -> dict:
    """A measured entry with when it was measured and how long it took (since ``started``,
    ``time.perf_counter()``)."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {**entry, "measured_at": now, "measure_s": round(time.perf_counter() - started, 2)}


def kept(
    part: str,
    key: str,
    entry: Mapping[str, Any],
    *,
    measured: bool,
    workdir: Mapping[str, Any],
    cache: str | None,
    machine_cache: str | None,
    log: Callable[[str], None] | None,
) -> str:
    """Keep ``entry`` (``part``, ``key``) where it is missing and say where it came from: just
    ``measured`` (written to the workdir's and the machine's caches), the workdir's cache
    (``workdir``: as read), or the machine's (then copied to the workdir's, which keeps its own)."""
    if measured:
        _remember(cache, part, key, entry, log)
        _remember(machine_cache, part, key, entry, log)
        return f"measured in {entry['measure_s']:.1f} s"
    if key in workdir[part]:
        return f"cached from {cache}"
    _remember(cache, part, key, entry, log)
    return f"cached for this machine in {machine_cache}"


#: Cache files this process could not write and has said so about (once per file).
_unwritable: set[str] = set()


def _remember(path: str | None, part: str, key: str, value: Any, log: Callable[[str], None] | None) -> None:
    """Add one entry (``part``: one of ``PARTS``) to the cache file at ``path``,
    keeping its well-formed entries (a malformed file is replaced). A file that cannot be written
    only means the next run measures again: said once per file (``log``), never an error."""
    if path is None:
        return
    data = read_cache(path)
    data[part][key] = value
    try:
        write_cache(path, data)
    except OSError as e:
        if path not in _unwritable and log is not None:
            log(
                f"cannot write the kernel cache {path} ({type(e).__name__}: {e}): the next run measures again"
            )
        _unwritable.add(path)


__all__ = [
    "CACHE_FILE",
    "MACHINE_CACHE_VARIABLE",
    "PARTS",
    "TIE",
    "cache_path",
    "digest",
    "kept",
    "machine_cache_path",
    "read_cache",
    "stamped",
    "valid_dot_decision",
    "valid_dot_shapes",
    "writable",
    "write_cache",
]
