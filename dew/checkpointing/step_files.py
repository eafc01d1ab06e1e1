"""A checkpoint directory's steps, read and vouched for from their files alone.

- ``StepFiles``: one step's directory: which items it holds, which its save wrote or left empty,
  what its orbax step metadata records (the step count, the EMA record, the metrics, whether
  items carry checksums), each item's tree metadata, and the checksum check. Nothing here opens
  an orbax manager or reads an array's values, so a reader can look at a live run's steps
  without touching them (``store.Store`` does the reading and writing of values).
- The checksums each item carries (``dew.checkpointing.checksums``: ``CHECKSUMS``,
  ``write_checksums``, ``verify_item``, ``ChecksummedPyTreeHandler``) and which steps a directory
  keeps (``dew.checkpointing.retention.Retention``) are their own modules, re-exported here.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from dew.checkpointing import layout
from dew.checkpointing.checksums import CHECKSUMS as CHECKSUMS
from dew.checkpointing.checksums import ChecksummedPyTreeHandler as ChecksummedPyTreeHandler
from dew.checkpointing.checksums import verify_item
from dew.checkpointing.checksums import write_checksums as write_checksums
from dew.checkpointing.errors import CheckpointDamagedError, first_line
from dew.checkpointing.retention import Retention as Retention

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
