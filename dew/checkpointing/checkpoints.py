"""``Checkpoints``: the facade over the tiers (``store``, ``local``, read through ``tiers``), the
``writer`` and the ``retention``; each method states its contract and delegates."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from dew.averaging.ema import EMASpec
from dew.checkpointing import layout, local, positions
from dew.checkpointing.errors import CheckpointWriteError
from dew.checkpointing.retention import Retention
from dew.checkpointing.saves import Upload, metric_value, write_local, write_persistent
from dew.checkpointing.store import Store
from dew.checkpointing.tiers import Tiers
from dew.checkpointing.weights import debiased
from dew.checkpointing.writer import Writer, host_copy, snapshot
from dew.contracts.state import TrainState
from dew.data.dataset import DataPartition

log = logging.getLogger("dew.checkpoints")


class Checkpoints:
    """Holds the checkpoints of one run, in one directory.

    Constructing one opens nothing; the orbax managers are created on first use. ``directory`` is
    a path or a URI (``file://``, or ``gs://`` and friends when their filesystem package is
    installed). The directory keeps the latest ``keep`` steps (None: every step), so a resume has
    something recent, plus the step with the lowest ``best_metric`` a save reported
    (``keep_best=False``: only the latest). A save without that metric is never the best step.
    ``retention`` replaces the whole policy (the stix ``Checkpointer`` passes its own).

    ``local_directory`` names a path on every host's own disk where the run keeps one more
    checkpoint, the latest, written every ``local_every`` steps by fit; each process writes the
    shards its devices hold under a directory of its own (``local_path``). ``latest_step()`` is the
    newest step every process can read, local or persistent, and ``restore`` reads it from
    wherever it is. A local checkpoint restores onto the placement it was written with; the
    persistent one restores onto any mesh.

    Saves run on one background thread (``asynchronous=False``: each save returns once landed;
    always so in a multi-process run, whose orbax barriers are collectives that must not
    interleave with the loop's);
    ``upload(path)`` is called after each persistent save lands. ``ema`` is the run's EMA as
    ``dew.averaging.ema.record`` describes it (β's law, tracked leaves, accumulation); every save
    records it, so ``restore_ema`` debiases on its own. ``read_only=True`` opens another
    run's directory for restoring only. ``ocdbt`` is how steps are written (every one is read):
    None, the default, by the state's size as measured (``benchmarks/checkpoint.py``): a small
    state by dew itself in orbax's per-leaf zarr format (``direct_write``: orbax's fixed cost per
    item is most of a small save), a larger one by orbax in OCDBT; True / False: always by orbax,
    with / without OCDBT. A pruned step is renamed out of the
    directory's steps at once and its files removed on a thread of their own (``wait`` and
    ``close`` wait for that too). With several processes every process must make the same
    calls in the same order: ``latest_step()``, ``local_step()`` and saves are collectives, and
    ``latest``/``best`` are the seed's property spellings of ``latest_step()``/``best_step()``.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep: int | None = 2,
        local_directory: str | None = None,
        local_every: int | None = None,
        keep_best: bool = True,
        best_metric: str = "loss",
        asynchronous: bool = True,
        upload: Upload | None = None,
        read_only: bool = False,
        retention: Retention | None = None,
        ema: Mapping[str, Any] | None = None,
        ocdbt: bool | None = None,
    ):
        if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 1):
            raise ValueError(f"Checkpoints: keep must be None (keep all) or an int >= 1, got {keep!r}")
        if (local_directory is None) != (local_every is None):
            raise ValueError(
                "Checkpoints: local_directory and local_every go together, got "
                f"local_directory={local_directory!r}, local_every={local_every!r}"
            )
        if local_every is not None and (not isinstance(local_every, int) or local_every < 1):
            raise ValueError(f"Checkpoints: local_every must be an int >= 1, got {local_every!r}")
        self.store = Store(
            layout.directory(directory),
            retention or Retention(newest=keep, best=1 if keep_best else 0, metric=best_metric),
            read_only=read_only,
            ocdbt=ocdbt,
        )
        self.directory = os.fspath(self.store.directory)
        self.local_directory = None if local_directory is None else os.path.abspath(local_directory)
        self.local_every, self.upload, self.read_only = local_every, upload, read_only
        self.ema = None if ema is None else dict(ema)
        # With several processes each save runs on the loop's thread: orbax's barriers are
        # collectives, and a writer thread's would interleave with the step's own collectives
        # in a different order on each process.
        self.writer = Writer(asynchronous and not jax.distributed.is_initialized())
        self.tiers = Tiers(self.store, self.local_directory, self.writer.wait)

    @property
    def local_path(self) -> str:
        """Return this process's own local directory."""
        return self.tiers.local_path

    # --- what exists ----------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        """The steps in the persistent directory (waits for pending writes)."""
        return self.tiers.all_steps()

    def local_step(self) -> int | None:
        """The local step every process holds, or None (a collective with several processes)."""
        return self.tiers.local_step()

    def latest_step(self) -> int | None:
        """Return the newest step a resume can read, local or persistent (waits; a collective)."""
        return self.tiers.latest_step()

    def best_step(self) -> int | None:
        """Return the step with the lowest reported metric, or None when no save carried one."""
        self.wait()
        return self.store.retention.best_step(self.store.all_metrics())

    def metrics(self, step: int) -> dict[str, float] | None:
        """The metrics the save of ``step`` reported (None: saved without)."""
        return self.store.metrics(step)

    def ema_record(self, step: int) -> dict[str, Any] | None:
        """The EMA record kept with ``step`` (``dew.averaging.ema.record``; None: none kept)."""
        return self.tiers.ema_record(self.tiers.resolve(step))

    def restore_dataset_state(self, template: Any, step: int | None = None) -> Any:
        """The ``dataset_state`` saved at ``step`` (default: latest) in ``template``'s structure,
        or None when that checkpoint holds none."""
        return self.store.dataset_state(self.tiers.resolve(step), template)

    @property
    def best_metric(self) -> str:
        """The metric ``best_step`` ranks by (lowest is best)."""
        return self.store.retention.metric

    latest = property(latest_step, doc="The newest step a resume can read (``latest_step()``).")
    best = property(best_step, doc="The step with the lowest reported loss (``best_step()``).")

    def path(self, step: int) -> str:
        """The persistent directory of ``step``."""
        return os.fspath(self.store.path(step))

    def source(self, step: int) -> str:
        """Return the directory restore reads ``step`` from: this process's local one when the
        step is the local one every process holds, else the persistent one."""
        return self.tiers.source(step)

    # --- writing --------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: TrainState,
        saved: bytes | None,
        metrics: Mapping[str, float] | None = None,
        *,
        share: DataPartition | None = None,
        dataset_state: Any = None,
        ema: Mapping[str, Any] | None = None,
        keyed: bool = False,
    ) -> None:
        """Write ``state`` under ``step``, asynchronously.

        Sharded arrays go straight to orbax: no gather to the host. ``saved`` is the data
        stream's position as JSON bytes, stored as a uint8 row beside the ``share`` that read it
        (one row per process); a position without its share is refused. A write that fails
        surfaces from ``wait`` (or the next save); it is never swallowed. ``dataset_state`` is any
        pytree (numbers, strings, arrays: e.g. a grain iterator's state) stored beside the state
        (process 0's); ``ema`` (default: the constructor's) is the EMA record kept with the step.

        The state is saved under the step it is at; with ``keyed=True`` (the stix ``Checkpointer``)
        ``step`` is only the checkpoint's key, and the state's own step count is recorded beside
        it (``num_steps``), which a restore checks. Whatever can be refused without waiting for
        the device's current step (a bad step, a state at another step, a step already on disk,
        a metric that is not a number, a read-only directory) is refused here, before anything
        is queued, so a save's mistake never surfaces only at the next save.
        """
        self._writable()
        step, rows = layout.step_number(step), positions.global_rows(saved, share)
        metrics = None if metrics is None else {k: metric_value(k, v) for k, v in metrics.items()}
        if not keyed:  # reads the step count: waits for the step that made it, not for a write
            layout.check_step(step, state)
        self.writer.wait()  # one write in flight at most: a failed one stops here
        if self.store.path(step).exists():
            raise CheckpointWriteError(
                f"checkpoint step {step} was not written: {self.directory} already holds it; a run "
                "saves each step once (a rollback moves newer steps aside first)"
            )
        if dataset_state is not None:
            dataset_state = jax.tree.map(host_copy, dataset_state)
        ema = self.ema if ema is None else dict(ema)
        state = layout.with_law(state, ema)
        self.writer.submit(
            write_persistent,
            self.store,
            self.upload,
            step,
            snapshot(state),
            rows,
            metrics,
            dataset_state,
            ema,
            label=step,
        )

    def save_local(
        self, step: int, state: TrainState, saved: bytes | None, *, share: DataPartition | None = None
    ) -> None:
        """Write ``state`` under ``step`` to this process's local directory, asynchronously, in
        place of the local step before it. The placement rides along; a resume onto another one
        raises before reading shards from directories that do not hold them."""
        if self.local_directory is None:
            raise ValueError("Checkpoints.save_local: no local_directory was given")
        self._writable()
        step, row = layout.step_number(step), positions.local_row(saved, share)
        layout.check_step(step, state)  # at the call, as ``save`` does
        self.writer.wait()
        state = snapshot(layout.with_law(state, self.ema))
        self.writer.submit(write_local, self.local_path, self.ema, step, state, row, label=step)

    def wait(self) -> None:
        """Block until pending async writes (and uploads) have landed, and pruned steps are
        removed; re-raise the first write that failed. Deliberately unguarded: a checkpoint that
        did not land is data loss."""
        self.writer.wait()
        self.store.wait_removals()

    @property
    def saving(self) -> list[int]:
        """The steps whose writes are queued or running, oldest first (never blocks)."""
        return list(self.writer.pending)

    def abandon(self) -> None:
        """Stop waiting for the write in flight, for a process about to exit (a second Ctrl-C
        during a save): ``wait`` and ``close`` return at once after this. A save cut short
        leaves ``<step>.orbax-checkpoint-tmp``, which the next run's first save cleans up (and a
        pruned step not yet removed, ``.deleting-<step>-*``, which its next prune removes)."""
        self.writer.abandon()
        self.store.abandon_removals()

    def close(self) -> None:
        """Wait for pending writes, then release the manager and the writer thread."""
        try:
            self.writer.close()
        finally:
            self.store.close()

    def clear(self) -> None:
        """Delete every checkpoint of this run: the persistent directory (by process 0) and this
        process's local one. Waits for pending writes first."""
        self._writable()
        self.wait()
        self.store.clear()
        if self.local_directory is not None:
            local.remove(self.local_path)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("dew-checkpoints-clear")

    def verify(self, step: int | None = None) -> None:
        """Check that the checkpoint at ``step`` (default: latest) is whole before reading it:
        every item's checksums (persistent tier) or files (local tier), streamed on this host.
        Raises ``CheckpointDamagedError`` naming the step, the item and the file."""
        step = self.tiers.resolve(step)
        if self.tiers.is_local(step):
            local.verify(self.tiers.local_path, step)
        else:
            self.store.verify(step)

    def set_aside_damaged(self, step: int) -> str:
        """Move a damaged step out of the run's steps, never deleting it: a persistent step into
        the sibling ``<directory>.damaged-<time>/``, this process's local step to
        ``<local>/damaged-<step>-<time>``. Returns where it went."""
        self._writable()
        if self.tiers.is_local(step):
            return local.set_aside(self.tiers.local_path, step)
        aside = self.store.set_aside([step], "move", label="damaged")
        assert aside is not None  # one step, moved: set_aside returns where it went
        return os.fspath(aside) + f"/{step}"

    def roll_back(self, step: int, how: str = "move", *, announce: bool = True) -> list[int]:
        """Make ``step`` the newest checkpoint: the persistent steps after it are moved into a
        sibling directory (``how="move"``; ``store.last_aside`` names it) or deleted
        (``"delete"``), a newer local step is deleted. Returns the steps set aside; logs what was
        done and where (``announce=False``: the caller says it)."""
        if how not in ("move", "delete"):
            raise ValueError(f"Checkpoints.roll_back: how must be 'move' or 'delete', got {how!r}")
        self._writable()
        step = self.tiers.resolve(step)  # a step that is not stored raises before anything moves
        newer = [s for s in self.all_steps() if s > step]
        aside = self.store.set_aside(newer, how)
        local_newer = self.local_step()
        if local_newer is not None and local_newer > step:
            local.remove(self.local_path)
        if announce and (newer or (local_newer is not None and local_newer > step)):
            where = f"moved to {os.fspath(aside)}" if aside is not None else "deleted"
            log.warning(
                "rolled back to step %d: persistent steps %s %s%s",
                step,
                newer,
                where,
                f", local step {local_newer} deleted"
                if local_newer is not None and local_newer > step
                else "",
            )
        return newer

    # --- reading --------------------------------------------------------------------------------
    def stored(self, step: int | None = None) -> TrainState:
        """Return what the checkpoint at ``step`` (default: latest) holds, without reading its
        values: each field a ``jax.ShapeDtypeStruct`` tree, the same nested shape from either
        tier (orbax's metadata form: dicts for mappings and named nodes, lists for sequences),
        an unset field None."""
        return self.tiers.stored(self.tiers.resolve(step))

    def accumulation_template(self, step: int) -> Any:
        """Return the persisted pending-array shapes at ``step``, without reading their values
        (None when that checkpoint holds no unfinished accumulation)."""
        return self.stored(step).pending

    def restore(
        self,
        template: TrainState | None = None,
        step: int | None = None,
        *,
        share: DataPartition | None = None,
    ) -> tuple[TrainState, bytes | None]:
        """Restore the state at ``step`` (default: latest) and the data position of ``share``.

        ``template`` is a TrainState of ``jax.ShapeDtypeStruct`` (or arrays) naming the leaves
        to restore; a leaf's sharding, when set, is where the array is placed, so a checkpoint
        written on one mesh restores onto whatever mesh this run is using. ``None`` restores
        every leaf as a host array. A step that is the local one every process holds is read
        from the local directory, onto the placement it was written with; any other step from
        the persistent one. The position is the bytes the reader of ``share`` resumes from, or
        None without a share (or when the checkpoint stored none). The state's ``ema_law`` is
        the stored one, whatever the template's (None for a step written before states carried it).
        """
        return self.tiers.restore(template, self.tiers.resolve(step), share, read_opt_state=True)

    def resume(
        self,
        fresh: TrainState,
        step: int | None = None,
        *,
        share: DataPartition | None = None,
        restore_optimizer_state: bool = True,
        restore_rng_key: bool = True,
    ) -> tuple[TrainState, bytes | None]:
        """Restore onto a freshly initialised ``fresh`` state (its shapes, dtypes and shardings).

        With ``restore_optimizer_state=False`` the optimizer state is not read and ``fresh``'s is
        kept; with ``restore_rng_key=False`` ``fresh``'s key is kept. With no checkpoint at all
        (and no ``step`` asked for), ``fresh`` comes back unchanged with no position.
        """
        if step is None and self.latest_step() is None:
            return fresh, None
        template = jax.tree.map(layout.abstract_leaf, fresh)
        step = self.tiers.resolve(step)
        state, position = self.tiers.restore(template, step, share, read_opt_state=restore_optimizer_state)
        if not restore_optimizer_state:
            state = state.replace(opt_state=fresh.opt_state)
        if not restore_rng_key:
            state = state.replace(rng=fresh.rng)
        if state.ema_law is None:  # written before states carried their EMA's law
            state = state.replace(ema_law=fresh.ema_law)
        return state, position

    def restore_ema(
        self,
        template: Any,
        step: int | None = None,
        *,
        decay: float | EMASpec | None = None,
        accumulation: int | None = None,
    ) -> Any:
        """The debiased EMA parameters at ``step`` (default: latest) for sampling or evaluation.

        Reads only ``ema_params`` and ``extra``, never params or opt_state (which may be gone),
        and applies the live loop's correction ``ema / (1 − Π β_i)`` over the optimizer updates
        behind the step (``step // accumulation``). ``extra`` holds the step count and the EMA's
        law (β's law, the tracked leaves, the accumulation: ``TrainState.ema_law``, or the
        ``ema`` record a save was given), so no further argument is needed; an explicit
        ``decay`` (a β or an ``EMASpec``) or ``accumulation`` that contradicts it is an error,
        and one is required only for a state saved without any law. ``template``
        is a params tree (shape/dtype, optionally sharded), or None for host arrays. Raises
        ``CheckpointRestorationError`` (a ``ValueError``) when no checkpoint exists.
        """
        if step is not None and (isinstance(step, bool | float) or not isinstance(step, int | np.integer)):
            raise TypeError(
                f"restore_ema: step must be an int or None, got {step!r}; the EMA's decay is recorded in "
                "the checkpoint (pass decay= only to check it)"
            )
        step = self.tiers.resolve(step)
        ema, count, law = self.tiers.ema(template, step)
        where = f"checkpoint step {step} in {self.directory}"
        return debiased(ema, count, law, self.tiers.ema_record(step), where, decay, accumulation)

    def _writable(self) -> None:
        if self.read_only:
            raise ValueError(f"Checkpoints: {self.directory} was opened read_only; it cannot be written")
