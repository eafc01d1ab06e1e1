"""A checkpoint directory's steps, read and vouched for from their files alone.

- ``StepFiles``: one step's directory: which items it holds, which its save wrote or left empty,
  what its orbax step metadata records (the step count, the EMA record, the metrics, whether
  items carry checksums), each item's tree metadata, and the checksum check. Nothing here opens
  an orbax manager or reads an array's values, so a reader can look at a live run's steps
  without touching them (``store.Store`` does the reading and writing of values).
- Checksums, written after an item's data and verified before it is read. Each item directory
  of a persistent step (``<step>/params``, ``<step>/opt_state``, ...) gets a
  ``dew_checksums.json`` after its data is final and before the step is renamed into place (the
  store's ``ChecksummedPyTreeHandler`` writes it in orbax's ``finalize``; the local tier writes
  it into its temporary directory): the size and SHA-256 of every file under the item, computed
  by reading the files back (so it vouches for what is on disk, not for what was meant to be
  written). A step that is visible is therefore checksummed. ``verify_item`` streams the files
  again, one MiB at a time, on the host that is about to read them, and raises
  ``CheckpointDamagedError`` naming the step, the item and the first file that is missing,
  shorter or longer than written, or whose bytes changed. A step flagged as checksummed whose
  checksums are missing is incomplete (written by a dew that checksummed after the rename and
  was killed in between, or damaged since): ``verify_item`` says so. Steps from before checksums
  were written carry no ``checksummed`` flag in their metadata and are read unverified.
- ``Retention``: which steps a directory keeps, a pure function of the steps and their metrics.
  Two policies cover both APIs: dew's ``Checkpoints(keep=k)`` keeps the newest ``k`` steps,
  plus the one step with the lowest metric (``Retention(newest=k, best=1)``; ``keep_best=False``
  drops the second part); stix's ``keep_best=True`` keeps the ``max_to_keep`` lowest eval
  losses, plus the newest step (``Retention(newest=1, best=max_to_keep)``, so up to
  ``max_to_keep + 1`` on disk), and with ``keep_best=False`` the newest ``max_to_keep``
  (``Retention(newest=max_to_keep, best=0)``). ``newest=None`` keeps everything (no pruning). A
  step whose metrics lack the ranked metric (or carry none) is never among the best, but still
  counts among the newest, so pruning goes on whatever was saved. Ties rank the earlier step
  first: it reached that value first.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from dew.checkpointing import layout
from dew.checkpointing.errors import CheckpointDamagedError, first_line

STEP_METADATA = "_CHECKPOINT_METADATA"  # orbax's per-step JSON file
_ITEMS = (*layout.STATE_ITEMS, layout.DATA_ITEM, layout.DATASET_ITEM)


class StepFiles:
    """The files of step ``step`` in the checkpoint directory ``directory``."""

    def __init__(self, directory: epath.Path, step: int):
        self.directory, self.step = directory, step
        self.path = directory / str(step)

    def step_metadata(self) -> dict[str, Any]:
        """Orbax's step metadata, read as the JSON file it is (no manager, no item opened)."""
        try:
            meta = json.loads((self.path / STEP_METADATA).read_text())
        except (OSError, ValueError) as e:
            raise CheckpointDamagedError(
                f"checkpoint {self.path} is damaged: its step metadata {STEP_METADATA} cannot be read ({e})",
                path=str(self.path / STEP_METADATA),
            ) from e
        if not isinstance(meta, dict) or not isinstance(meta.get("custom_metadata") or {}, dict):
            raise CheckpointDamagedError(
                f"checkpoint {self.path} is damaged: step metadata {meta!r:.100}",
                path=str(self.path / STEP_METADATA),
            )
        problem = custom_problem(meta.get("custom_metadata") or {})
        if problem is not None:
            raise CheckpointDamagedError(
                f"checkpoint step {self.step} is damaged: {self.path / STEP_METADATA} records {problem}",
                step=self.step,
                path=str(self.path / STEP_METADATA),
            )
        return meta

    def custom(self) -> dict[str, Any]:
        """dew's part of the step metadata (what ``Store.write`` recorded)."""
        return self.step_metadata().get("custom_metadata") or {}

    def metrics(self) -> dict[str, float] | None:
        """The metrics the save reported (None: saved without)."""
        meta = self.step_metadata()
        return (meta.get("custom_metadata") or {}).get("metrics", meta.get("metrics"))  # older dew: orbax's

    def ema_record(self) -> dict[str, Any] | None:
        """The EMA record the save kept (None: written without one)."""
        return self.custom().get("ema")

    def present_items(self) -> list[str]:
        return [n for n in _ITEMS if (self.path / n).is_dir()]

    def empty_items(self) -> list[str]:
        """The items the save had nothing to write for (orbax writes no tree without arrays)."""
        return list(self.custom().get("empty_items", []))

    def missing_items(self) -> list[str]:
        """The items the step lacks: required ones that were not empty, and any its save wrote
        (orbax's step metadata names each item written, ``item_handlers``) that is gone since,
        e.g. a deleted ``data`` item, whose loss would silently restart the data stream."""
        handlers = self.step_metadata().get("item_handlers")
        written = set(handlers) if isinstance(handlers, dict) else set()
        expected = (set(layout.REQUIRED_ITEMS) - set(self.empty_items())) | written
        return sorted((expected & set(_ITEMS)) - set(self.present_items()))

    def check_complete(self) -> None:
        """Raise ``CheckpointDamagedError`` when the step lacks an item it requires or was written
        with (``missing_items``), naming the first."""
        missing = self.missing_items()
        if missing:
            raise CheckpointDamagedError(
                f"checkpoint step {self.step} in {self.directory} is damaged: items {missing} are missing",
                step=self.step,
                item=missing[0],
                path=str(self.path / missing[0]),
            )

    def check_step(self, count: int) -> None:
        """The restored step count must agree with the one the checkpoint's metadata records:
        ``num_steps`` when the save recorded it (a stix save keyed by a step number of its own),
        else the step it was saved under; and the metadata's key must be this step's (the
        directory's name). Otherwise the step is damaged (``CheckpointDamagedError``), so a
        resume from the latest step sets it aside like other damage."""
        custom = self.custom()
        key, recorded = custom.get("step"), custom.get("num_steps", custom.get("step"))
        try:
            agrees = (
                key is not None and recorded is not None and int(key) == self.step and int(recorded) == count
            )
        except (TypeError, ValueError):
            agrees = False
        if not agrees:  # damage (a step directory renamed or copied, its metadata edited): set aside
            raise CheckpointDamagedError(
                f"checkpoint step {self.step} in {self.directory} is damaged: the restored state is at "
                f"step {count}, its metadata records step {recorded}"
                + ("" if key == recorded else f" under key {key}")
                + ("" if key == self.step else f", in a directory named {self.step}"),
                step=self.step,
                path=str(self.path / STEP_METADATA),
            )

    def metadata(self, items: list[str] | None = None) -> dict[str, Any]:
        """The orbax metadata tree (shapes, dtypes; no values) of each named item, or of every
        item present; only those are opened. Items a caller does not ask for may be missing
        (``restore_ema`` serves a step whose params and opt_state are gone)."""
        present = self.present_items()
        if items is None:
            self.check_complete()
        trees = {}
        for item in present if items is None else items:
            if item not in present:
                raise CheckpointDamagedError(
                    f"checkpoint step {self.step} in {self.directory} is damaged: item {item!r} is missing",
                    step=self.step,
                    item=item,
                )
            try:
                trees[item] = _metadata_reader().metadata(self.path / item).tree
            except Exception as e:
                raise CheckpointDamagedError(
                    f"checkpoint step {self.step} in {self.directory} is damaged: item {item!r} has "
                    f"unreadable metadata ({type(e).__name__}: {first_line(e)})",
                    step=self.step,
                    item=item,
                ) from e
        return trees

    def verify(self, items: list[str] | None = None) -> None:
        """Check the checksums of the named items (default: every item present, and none
        missing that the step requires or was written with), streaming each file on this host; raise
        ``CheckpointDamagedError`` naming the step, the item and the file. Steps written before
        checksums were (no ``checksummed`` flag in their metadata) pass unverified."""
        present = self.present_items()
        if items is None:
            self.check_complete()
            items = present
        if not self.custom().get("checksummed"):
            return
        for item in items:
            verify_item(self.step, item, self.path / item)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def custom_problem(custom: dict[str, Any]) -> str | None:
    """What is malformed in dew's part of a step's metadata (the keys ``Store.write`` records and
    a restore reads back), or None."""
    for key in ("step", "num_steps"):
        if key in custom and not _count(custom[key], 0):
            return f"{key}={custom[key]!r:.60} (expected an int >= 0)"
    empty = custom.get("empty_items", [])
    if not isinstance(empty, list) or not all(isinstance(item, str) for item in empty):
        return f"empty_items={empty!r:.60} (expected a list of item names)"
    metrics = custom.get("metrics")
    if metrics is not None and (
        not isinstance(metrics, dict) or not all(_number(v) for v in metrics.values())
    ):
        return f"metrics={metrics!r:.60} (expected an object of numbers)"
    if "rng_impl" in custom and not isinstance(custom["rng_impl"], str):
        return f"rng_impl={custom['rng_impl']!r:.60} (expected a PRNG implementation's name)"
    if "checksummed" in custom and not isinstance(custom["checksummed"], bool):
        return f"checksummed={custom['checksummed']!r:.60} (expected true or false)"
    ema = custom.get("ema")
    if ema is None:
        return None
    if not isinstance(ema, dict) or not _number(ema.get("decay")) or not 0 <= ema["decay"] < 1:
        return f"ema={ema!r:.80} (expected an EMA record whose decay is a number in [0, 1))"
    for key in ("half_life", "ramp_up"):
        if ema.get(key) is not None and not (_number(ema[key]) and ema[key] > 0):
            return f"ema.{key}={ema[key]!r:.60} (expected a number > 0 or null)"
    if "accumulation" in ema and not _count(ema["accumulation"], 1):
        return f"ema.accumulation={ema['accumulation']!r:.60} (expected an int >= 1)"
    tracked = ema.get("tracked")
    if tracked is not None and (
        not isinstance(tracked, list) or not all(isinstance(t, str) for t in tracked)
    ):
        return f"ema.tracked={tracked!r:.60} (expected a list of leaf paths or null)"
    return None


@functools.cache
def _metadata_reader() -> ocp.PyTreeCheckpointHandler:
    """Reads an item's tree metadata on its own (built on first use: it queries the backend)."""
    return ocp.PyTreeCheckpointHandler()


# --- checksums ------------------------------------------------------------------------------------
CHECKSUMS = "dew_checksums.json"
_CHUNK = 1 << 20


def _files(item_dir: epath.Path) -> list[epath.Path]:
    """Every file under ``item_dir`` but the checksums (a walk by ``iterdir``: epath refuses
    recursive globs, which would be thousands of requests on object stores)."""
    out, pending = [], [item_dir]
    while pending:
        for path in pending.pop().iterdir():
            if path.is_dir():
                pending.append(path)
            elif path.name != CHECKSUMS and not path.name.startswith(f".{CHECKSUMS}"):
                out.append(path)
    return sorted(out, key=str)


def digest(path: epath.Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, streamed."""
    h, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def write_checksums(item_dir: epath.Path) -> dict[str, Any]:
    """Hash every file under ``item_dir`` and write ``dew_checksums.json`` there (write to a
    temporary name, then rename, so a reader sees all of it or none)."""
    item_dir = epath.Path(item_dir)
    files = {}
    for path in _files(item_dir):
        size, sha = digest(path)
        files[str(path.relative_to(item_dir))] = {"size": size, "sha256": sha}
    record = {"algorithm": "sha256", "files": files}
    tmp = item_dir / f".{CHECKSUMS}.{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.rename(item_dir / CHECKSUMS)
    return record


def _read_checksums(text: str) -> dict[str, dict[str, Any]]:
    """The ``files`` of a checksums record, checked against the shape ``write_checksums`` gives
    (``{"files": {relative path: {"size": int >= 0, "sha256": 64 hex digits}}}``); anything else
    raises ``ValueError`` saying what was found."""
    record = json.loads(text)
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        found = f"files {_shape(record.get('files'))}" if isinstance(record, dict) else _shape(record)
        raise ValueError(f'expected {{"files": {{path: {{"size": int, "sha256": hex}}}}}}, found {found}')
    for name, entry in record["files"].items():
        parts = name.replace("\\", "/").split("/")
        if not name or name.startswith("/") or ".." in parts:
            raise ValueError(f"file name {name!r} is not a path inside the item")
        if (
            not isinstance(entry, dict)
            or not _is_int(entry.get("size"))
            or entry["size"] < 0
            or not isinstance(entry.get("sha256"), str)
            or len(entry["sha256"]) != 64
            or any(c not in "0123456789abcdef" for c in entry["sha256"])
        ):
            expected = '{"size": int >= 0, "sha256": 64 hex digits}'
            raise ValueError(f"file {name!r}: expected {expected}, found {entry!r:.200}")
    return record["files"]


def _shape(value: object) -> str:
    return "null" if value is None else type(value).__name__


def verify_item(step: int, item: str, item_dir: epath.Path) -> None:
    """Check every file ``dew_checksums.json`` lists under ``item_dir``; raise
    ``CheckpointDamagedError`` naming ``step``, ``item`` and the file at the first mismatch."""
    item_dir = epath.Path(item_dir)
    where = f"checkpoint step {step} is damaged: item {item!r}"
    record_path = item_dir / CHECKSUMS
    if not item_dir.exists():
        raise CheckpointDamagedError(
            f"{where} is missing ({item_dir})", step=step, item=item, path=str(item_dir)
        )
    if not record_path.exists():
        raise CheckpointDamagedError(
            f"{where} is incomplete: its checksums ({record_path}) never landed",
            step=step,
            item=item,
            path=str(record_path),
        )
    try:
        files = _read_checksums(record_path.read_text())
    except (ValueError, RecursionError) as e:
        raise CheckpointDamagedError(
            f"{where}: its checksums {record_path} are unreadable ({e})",
            step=step,
            item=item,
            path=str(record_path),
        ) from None
    for name, expected in sorted(files.items()):
        path = item_dir / name
        if not path.exists():
            raise CheckpointDamagedError(
                f"{where}, file {path} is missing", step=step, item=item, path=str(path)
            )
        size, sha = digest(path)
        if size != expected["size"]:
            raise CheckpointDamagedError(
                f"{where}, file {path} holds {size} bytes, {expected['size']} were written",
                step=step,
                item=item,
                path=str(path),
            )
        if sha != expected["sha256"]:
            raise CheckpointDamagedError(
                f"{where}, file {path} does not match its checksum (its bytes changed after it was written)",
                step=step,
                item=item,
                path=str(path),
            )


class ChecksummedPyTreeHandler(ocp.PyTreeCheckpointHandler):
    """The persistent tier's orbax handler (``store`` registers it for every item through
    orbax's ``handler_registry``): orbax's pytree handler, whose ``finalize`` also writes the
    item's ``dew_checksums.json``.

    Orbax calls ``finalize`` on the primary process, after every process has written its part
    and before the item and then the step are renamed into place; so the checksums are inside
    the step before it becomes visible, and a kill at any moment leaves either a complete,
    checksummed step or none."""

    def finalize(self, directory: epath.Path) -> None:
        super().finalize(directory)  # merges the per-process files into the final ones
        write_checksums(directory)

    @classmethod
    def typestr(cls) -> str:
        """The name orbax records for each item's handler in a step's metadata
        (``item_handlers``): the one checkpoints have carried since their items were
        checksummed, when the handler had a module of its own, so the format stays as it was."""
        return "dew.checkpointing.checksummed_handler.ChecksummedPyTreeHandler"


# --- which steps a directory keeps ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Retention:
    """Keep the ``newest`` steps (None: all) and the ``best`` steps by lowest ``metric``."""

    newest: int | None
    best: int = 0
    metric: str = "loss"

    def __post_init__(self):
        if self.newest is not None and (not _is_int(self.newest) or self.newest < 0):
            raise ValueError(f"Retention: newest must be None or an int >= 0, got {self.newest!r}")
        if not _is_int(self.best) or self.best < 0:
            raise ValueError(f"Retention: best must be an int >= 0, got {self.best!r}")
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"Retention: metric must be a non-empty string, got {self.metric!r}")

    def ranked(self, metrics: Mapping[int, Mapping[str, float] | None]) -> list[int]:
        """Steps that reported a finite ``metric``, lowest first (ties: earlier step first)."""
        scored = [
            (float(m[self.metric]), step)
            for step, m in metrics.items()
            if m is not None and self.metric in m and math.isfinite(float(m[self.metric]))
        ]
        return [step for _, step in sorted(scored)]

    def best_step(self, metrics: Mapping[int, Mapping[str, float] | None]) -> int | None:
        """The step with the lowest ``metric``, or None when no step reported it."""
        ranked = self.ranked(metrics)
        return ranked[0] if ranked else None

    def keep(self, metrics: Mapping[int, Mapping[str, float] | None]) -> set[int]:
        """The steps to keep, given every stored step and its metrics (None: saved without)."""
        steps = sorted(metrics)
        if self.newest is None:
            return set(steps)
        kept = set(steps[max(0, len(steps) - self.newest) :]) if self.newest else set()
        kept.update(self.ranked(metrics)[: self.best])
        return kept


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
