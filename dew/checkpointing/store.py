"""The persistent tier: one orbax checkpoint per step, in a directory that is a path or a URI.

Each step holds the items ``layout`` names, plus orbax's step metadata, whose custom part records
the step count the state must agree with, the items that were empty (orbax cannot write a tree
without arrays, e.g. plain SGD's optimizer state) and the metrics the save reported (the
retention ranks by them). Pruning is ``retention.Retention``'s, applied after each save lands;
orbax's own is off so that any metric name, or none, works. Everything is arrays and JSON;
nothing written or read is pickled. A small state's step is written by ``direct_write`` (the
files orbax writes without OCDBT, without orbax's fixed cost per item), a larger one by orbax;
orbax reads every step either way.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import functools
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from dew.checkpointing import direct_write, layout, positions
from dew.checkpointing.checksums import ChecksummedPyTreeHandler
from dew.checkpointing.errors import (
    CheckpointRestorationError,
    CheckpointWriteError,
    first_line,
)
from dew.checkpointing.item_reads import dataset_state, read_items, restore_items
from dew.checkpointing.retention import Retention
from dew.checkpointing.step_files import StepFiles
from dew.checkpointing.writer import checkpoint_thread, yield_to_the_loop
from dew.contracts.state import TrainState
from dew.data.dataset import DataPartition

_HANDLER_TYPESTR = ChecksummedPyTreeHandler.typestr()  # what orbax records for each item
_DELETING = ".deleting-"  # a step being deleted: out of orbax's step namespace
log = logging.getLogger("dew.checkpoints")


class Store:
    """The orbax checkpoints of one directory (``epath.Path``); the manager opens on first use."""

    def __init__(
        self,
        directory: epath.Path,
        retention: Retention,
        *,
        read_only: bool = False,
        ocdbt: bool | None = None,
    ):
        self.directory, self.retention, self.read_only = directory, retention, read_only
        # How a step is written (a reader reads every one): None, chosen by the state's size, as
        # measured (benchmarks/checkpoint.py): a small state (``direct_write.eligible``) by dew
        # itself in orbax's per-leaf zarr format, skipping orbax's fixed per-item cost; a larger
        # one by orbax in OCDBT (one key-value store per item). True / False: always by orbax,
        # with / without OCDBT.
        self.ocdbt = ocdbt
        self.small_bytes: float = direct_write.SMALL_BYTES  # the largest state written directly
        self._manager: ocp.CheckpointManager | None = None
        self._writing = False  # whether the open manager is a writer's (see ``manager``)
        self._ocdbt = True  # the format the open manager's handlers write
        self._metrics: dict[int, dict[str, float] | None] = {}
        self.last_aside: epath.Path | None = None  # where ``set_aside`` last moved steps
        self._remover: concurrent.futures.ThreadPoolExecutor | None = None  # ``_remove_later``
        self._removing: list[tuple[epath.Path, concurrent.futures.Future]] = []
        self._through_orbax = False  # whether a write went through orbax (its threads run niced)

    def manager(self, *, writing: bool = False, ocdbt: bool = True) -> ocp.CheckpointManager:
        """The orbax manager; ``writing=True`` (a save) reopens a reading one as a writer, and a
        writer of the other format (``ocdbt``) as one of this. Either reads both formats.

        Only a writer cleans up unfinished saves (``<step>.orbax-checkpoint-tmp``) or creates the
        directory: a manager opened to list or read steps leaves every file alone, so reading a
        live run's directory (``pipeline``, ``dew.sample``, a resume's first look) never removes
        the save that run has in flight. A run's first save cleans up what a killed
        predecessor left; the workdir lock makes that run the only writer."""
        if writing and self._manager is not None and (not self._writing or self._ocdbt != ocdbt):
            self.close()
        if self._manager is None:
            self._writing, self._ocdbt = writing and not self.read_only, ocdbt
            self._manager = open_manager(self.directory, writing=self._writing, ocdbt=ocdbt)
            if self._writing:  # its cleanup runs on a thread: a direct write must not race it
                self._manager._maybe_await_cleanup_tmp_directory()
        return self._manager

    def abandon_removals(self) -> None:
        """Stop waiting for removals (a process about to exit); what is left, out of the step
        namespace already, the next delete removes."""
        self._removing.clear()
        if self._remover is not None:
            self._remover.shutdown(wait=False, cancel_futures=True)
            self._remover = None

    def close(self) -> None:
        self.wait_removals()
        if self._remover is not None:
            self._remover.shutdown()
            self._remover = None
        if self._manager is not None:
            self._manager.close()
        self._manager = None

    def path(self, step: int) -> epath.Path:
        return self.directory / str(step)

    def steps(self) -> list[int]:
        """The steps that have landed (``landed_steps``: no manager opened or reloaded on one
        process on a local disk)."""
        return landed_steps(self.directory, self.manager)

    def metrics(self, step: int) -> dict[str, float] | None:
        """The metrics the save of ``step`` reported (None: saved without)."""
        if step not in self._metrics:
            self._metrics[step] = self.files(step).metrics()
        return self._metrics[step]

    def all_metrics(self) -> dict[int, dict[str, float] | None]:
        return {step: self.metrics(step) for step in self.steps()}

    # --- writing ----------------------------------------------------------------------------------
    def write(
        self,
        step: int,
        state: TrainState,
        rows: dict[str, Any] | None,
        metrics: dict[str, float] | None,
        dataset_state: Any = None,
        ema: Mapping[str, Any] | None = None,
    ) -> None:
        """One orbax checkpoint, landed (atomically renamed) on return; then prune. ``ema`` is
        the run's EMA record (``dew.averaging.ema.record``), kept in the step's metadata."""
        items = {name: ocp.args.PyTreeSave(tree) for name, tree in layout.items_from_state(state).items()}
        if rows is not None:
            items[layout.DATA_ITEM] = ocp.args.PyTreeSave(rows)
        if dataset_state is not None:
            items[layout.DATASET_ITEM] = ocp.args.PyTreeSave(dataset_state)
        empty = [name for name, arg in items.items() if not jax.tree.leaves(arg.item)]
        for name in empty:
            del items[name]
        custom = {
            "format": layout.FORMAT,
            "step": step,
            # the state's own step count: ``step`` unless a stix save keyed it otherwise
            "num_steps": int(np.asarray(jax.device_get(state.step))),
            "process_count": jax.process_count(),
            "empty_items": empty,
            "metrics": metrics,
            "checksummed": True,  # each item holds its dew_checksums.json (integrity)
        }
        if ema is not None:
            custom["ema"] = dict(ema)
        rng_impl = layout.key_impl(state.rng)
        if rng_impl is not None:  # a typed key: ``extra.rng`` holds its data (layout.typed_rng)
            custom["rng_impl"] = rng_impl
        if self.read_only:
            raise CheckpointWriteError(
                f"checkpoint step {step} was not written: {self.directory} is read-only here"
            )
        if step in self.steps():
            raise CheckpointWriteError(
                f"checkpoint step {step} was not written: {self.directory} already holds steps "
                f"{self.steps()}; a run saves each step once (a rollback moves newer steps aside first)"
            )
        try:
            trees = {name: arg.item for name, arg in items.items()}
            if (
                self.ocdbt is None
                and layout.is_local(self.directory)
                and direct_write.eligible(trees, self.small_bytes)
            ):
                # a writing manager, opened once: it creates the directory and removes what a
                # killed write left (``<step>.orbax-checkpoint-tmp``)
                self.manager(writing=True, ocdbt=self._ocdbt if self._writing else True)
                direct_write.write_step(self.directory, step, trees, custom, _HANDLER_TYPESTR)
            else:
                self._through_orbax = True
                yield_to_the_loop()  # the writer's thread, not the loop's (``writer.WRITER_NICENESS``)
                manager = self.manager(writing=True, ocdbt=self.ocdbt is not False)
                manager.save(step, args=ocp.args.Composite(**items), custom_metadata=custom, force=True)
                manager.wait_until_finished()
        except Exception as e:
            raise CheckpointWriteError(f"checkpoint step {step} did not land in {self.directory}: {e}") from e
        self._metrics[step] = metrics
        self.prune()

    def prune(self) -> None:
        """Delete the steps the retention does not keep."""
        if self.read_only:
            return
        metrics = self.all_metrics()
        self.delete(sorted(set(metrics) - self.retention.keep(metrics)))

    def delete(self, steps: list[int]) -> None:
        """Delete ``steps``, each atomically: renamed out of the step namespace first, then
        removed, so a kill mid-delete never leaves a half-deleted directory named by a step."""
        if not steps:
            return
        if jax.process_count() > 1:  # every process has read what it needs of these steps
            multihost_utils.sync_global_devices("dew-checkpoints-before-delete")
        if jax.process_index() == 0:
            self.wait_removals()
            for stale in self.directory.glob(f"{_DELETING}*"):
                stale.rmtree()  # left by a run killed mid-delete
            for step in steps:
                doomed = self.directory / f"{_DELETING}{step}-{uuid.uuid4().hex}"
                self.path(step).rename(doomed)  # the step is gone from here on
                self._remove_later(doomed)
        for step in steps:
            self._metrics.pop(step, None)
        self._sync_steps()

    def _remove_later(self, doomed: epath.Path) -> None:
        """Remove a directory already renamed out of the step namespace on a thread of its own:
        removing a step's files took longer than writing one (benchmarks/checkpoint.py), and
        nothing waits for it but ``wait_removals`` (``Checkpoints.wait``, ``close``)."""
        if self._remover is None:  # at a lower priority after orbax's writes, as the writer
            self._remover = concurrent.futures.ThreadPoolExecutor(
                1,
                thread_name_prefix="dew-checkpoints-remove",
                initializer=functools.partial(checkpoint_thread, lowered=self._through_orbax),
            )
        self._removing.append((doomed, self._remover.submit(doomed.rmtree)))

    def wait_removals(self) -> None:
        """Block until the steps being removed are gone. One that cannot be removed is said in
        one line (it is out of the step namespace already; the next delete tries again)."""
        while self._removing:
            doomed, future = self._removing.pop(0)
            try:
                future.result()
            except Exception as e:
                log.warning("could not remove the deleted checkpoint %s: %s", doomed, first_line(e))

    def _sync_steps(self) -> None:
        """After this store changed the step directories: processes meet, orbax rereads them."""
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("dew-checkpoints-steps-changed")
        if self._manager is not None:
            self._manager.reload()

    def set_aside(self, steps: list[int], how: str, label: str = "rolled-back") -> epath.Path | None:
        """Move ``steps`` into a sibling directory ``<directory>.<label>-<time>`` (``how="move"``;
        returned) or delete them."""
        if not steps:
            return None
        if how == "delete":
            self.delete(steps)
            return None
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = self.directory.parent / f"{self.directory.name}.{label}-{stamp}"
        if jax.process_index() == 0:
            aside.mkdir(parents=True, exist_ok=True)
            for step in steps:
                self.path(step).rename(aside / str(step))
        for step in steps:
            self._metrics.pop(step, None)
        self._sync_steps()
        self.last_aside = aside
        return aside

    def clear(self) -> None:
        self.close()
        self._metrics.clear()
        if jax.process_index() == 0 and self.directory.exists():
            self.directory.rmtree()

    # --- reading ----------------------------------------------------------------------------------
    def restore(
        self, step: int, template: TrainState | None, share: DataPartition | None, read_opt_state: bool
    ) -> tuple[TrainState, bytes | None]:
        """The state at ``step`` (onto ``template``'s placement, or as host arrays) and the
        position of ``share``."""
        items = restore_items(self.files(step), template, share is not None, read_opt_state)
        restored = self.read_items(step, items)
        state = layout.state_from_items(restored)
        self.check_step(step, int(np.asarray(state.step)))
        position = None
        if share is not None and layout.DATA_ITEM in restored:
            try:
                position = positions.position_for(restored[layout.DATA_ITEM], share, jax.process_index())
            except KeyError as e:
                raise CheckpointRestorationError(f"checkpoint step {step}: {e.args[0]}") from None
        return state, position

    def stored_extra(self, step: int, key: str) -> Any:
        """The shapes of what ``step``'s ``extra`` item stores under ``key`` (the EMA law ``ema``,
        the loss scale ``loss_scale``), or None; only ``extra``'s metadata is opened, no values
        read, so a step whose other items are unreadable can still be fitted and restored."""
        extra = self.metadata(step, ["extra"])["extra"]
        return None if extra.get(key) is None else layout.shape_dtype_tree(extra[key])

    def stored(self, step: int) -> TrainState:
        trees = {item: layout.shape_dtype_tree(tree) for item, tree in self.metadata(step).items()}
        trees.update({item: None for item in self.empty_items(step)})
        return layout.state_from_items(trees)

    def read_items(self, step: int, templates: Mapping[str, Any]) -> dict[str, Any]:
        """Read the named items (template or None for host arrays), checking templates first and
        each item's checksums before any of its bytes are used (``verify``)."""
        return read_items(self.manager, self.files(step), templates)

    def files(self, step: int) -> StepFiles:
        """What ``step``'s directory holds, read from its files (no manager, no values)."""
        return StepFiles(self.directory, step)

    def metadata(self, step: int, items: list[str] | None = None) -> dict[str, Any]:
        return self.files(step).metadata(items)

    def verify(self, step: int, items: list[str] | None = None) -> None:
        self.files(step).verify(items)

    def present_items(self, step: int) -> list[str]:
        return self.files(step).present_items()

    def missing_items(self, step: int) -> list[str]:
        return self.files(step).missing_items()

    def empty_items(self, step: int) -> list[str]:
        return self.files(step).empty_items()

    def ema_record(self, step: int) -> dict[str, Any] | None:
        return self.files(step).ema_record()

    def check_step(self, step: int, count: int) -> None:
        self.files(step).check_step(count)

    def dataset_state(self, step: int, template: Any) -> Any:
        """The saved ``dataset`` pytree in ``template``'s structure, each leaf of the type of the
        template's (``checkpointing.dataset_state``), or None when the step has none."""
        return dataset_state(self.manager, self.files(step), template)


def open_manager(directory: epath.Path, *, writing: bool, ocdbt: bool = True) -> ocp.CheckpointManager:
    """An orbax manager of ``directory`` whose items are read (and, ``writing``, written) through
    ``ChecksummedPyTreeHandler`` in the ``ocdbt`` format; it reads both formats. Only a writer
    cleans up unfinished saves or creates the directory: a reader leaves every file alone."""
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=False,  # the Writer's thread keeps it off the loop
        cleanup_tmp_directories=writing,
        create=writing,
        # Not orbax's read_only (it prints warnings on a reader's console): a reading manager is
        # never asked to save or delete, and its callers refuse to write.
    )
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for name in (*layout.STATE_ITEMS, layout.DATA_ITEM, layout.DATASET_ITEM):
        handler = ChecksummedPyTreeHandler(use_ocdbt=ocdbt)
        registry.add(name, ocp.args.PyTreeSave, handler)
        registry.add(name, ocp.args.PyTreeRestore, handler)
    return ocp.CheckpointManager(directory, options=options, handler_registry=registry)


def landed_steps(directory: epath.Path, manager: Callable[[], ocp.CheckpointManager]) -> list[int]:
    """The steps of ``directory`` that have landed. One process on a local disk reads them from
    the directory, as orbax lists them (a step is a directory named by its number; one in flight
    is ``<step>.orbax-checkpoint-tmp``, one being deleted ``.deleting-...``), with no manager to
    open or reload after a direct write; otherwise ``manager()`` lists them."""
    if jax.process_count() == 1 and layout.is_local(directory):
        if not directory.exists():
            return []
        return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())
    # With several processes every one must open its manager (orbax meets at a barrier there)
    # whatever it sees: process 0 may create the directory while another looks.
    if jax.process_count() == 1 and not directory.exists():
        return []
    return sorted(manager().all_steps())
