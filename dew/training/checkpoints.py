"""``Checkpoints``: one run's checkpoints in one directory, written off the loop's critical path.

On disk each step is one orbax checkpoint of separately restorable items:

    params/      the live parameters
    opt_state/   the optimizer state
    ema_params/  the raw (not debiased) EMA, so ``restore_ema`` needs neither of the above
    extra/       the small scalars: step, rng key
    pending/     gradient sums of an unfinished accumulation (only when the state has them)
    data/        data positions: JSON bytes as uint8 rows, one per process with its share

plus orbax's step metadata, whose custom part records the step count the state must agree with.
With ``local_directory`` each process also keeps one more checkpoint, the latest, on its own
disk: the shards its devices hold and the placement they were written with.

Everything is arrays and JSON; nothing written or read is pickled, so loading a checkpoint can
never execute code.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as ocm

from dew.data.dataset import DataPartition
from dew.training import checkpoint_layout as layout
from dew.training import ema as ema_lib
from dew.training import local_checkpoint
from dew.training.checkpoint_errors import CheckpointRestorationError, CheckpointWriteError, first_line
from dew.training.ema import EMASpec
from dew.training.run_metadata import RUN_METADATA, read_run_metadata, save_run_metadata
from dew.training.state import TrainState, num_updates

_STEP_METADATA = "_CHECKPOINT_METADATA"  # orbax's per-step JSON file
Upload = Callable[[str], "concurrent.futures.Future | None"]


class _MetriclessSaveFilter(logging.Filter):
    """A save without metrics is a supported case (it is never ranked best), not a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Requested `tracked_metric`; did not provide metrics" not in record.getMessage()


logging.getLogger("absl").addFilter(_MetriclessSaveFilter())


class Checkpoints:
    """Holds the checkpoints of one run, in one directory.

    Constructing one opens nothing; the orbax managers are created on first use. The directory
    keeps the latest ``keep`` steps, so a resume has something recent, plus the step with the
    lowest ``best_metric`` a save reported (``keep_best=False`` keeps only the latest). A save
    without metrics can never become the best step.

    ``local_directory`` names a path on every host's own disk where the run keeps one more
    checkpoint, the latest, written every ``local_every`` steps by fit; each process writes the
    shards its devices hold under a directory of its own (``local_path``). ``latest`` is the
    newest step every process can read, local or persistent, and ``restore`` reads it from
    wherever it is. A local checkpoint restores onto the placement it was written with; the
    persistent one restores onto any mesh.

    Saves run on one background thread, so the loop pays only for a device-side copy of the
    state (the step donates its input buffers); a save waits for the one before it, so at most
    one copy is held and a failed write stops the next save. ``asynchronous=False`` makes each save return
    once it has landed. ``read_only=True`` opens another run's directory for restoring only.
    ``ema`` is the run's EMA as ``dew.training.ema.record`` describes it (β's law, tracked
    leaves, accumulation); every save records it, so ``restore_ema`` debiases on its own.
    ``upload(path)`` is called after each persistent save lands (it may
    return a future, which ``wait`` waits for). With several processes, every process must
    make the same calls in the same order (saves and ``latest`` agree across processes).
    """

    def __init__(
        self,
        directory: str,
        *,
        keep: int = 2,
        local_directory: str | None = None,
        local_every: int | None = None,
        keep_best: bool = True,
        best_metric: str = "loss",
        asynchronous: bool = True,
        upload: Upload | None = None,
        read_only: bool = False,
        ema: Mapping[str, Any] | None = None,
    ):
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"Checkpoints: keep must be an int >= 1, got {keep!r}")
        if (local_directory is None) != (local_every is None):
            raise ValueError(
                "Checkpoints: local_directory and local_every go together, got "
                f"local_directory={local_directory!r}, local_every={local_every!r}"
            )
        if local_every is not None and (not isinstance(local_every, int) or local_every < 1):
            raise ValueError(f"Checkpoints: local_every must be an int >= 1, got {local_every!r}")
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.keep_best = keep_best
        self.best_metric = best_metric
        self.local_directory = None if local_directory is None else os.path.abspath(local_directory)
        self.local_every = local_every
        self.asynchronous = asynchronous
        self.upload = upload
        self.read_only = read_only
        self.ema = None if ema is None else dict(ema)
        self._manager: ocp.CheckpointManager | None = None
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: list[concurrent.futures.Future] = []

    # --- the orbax managers ---------------------------------------------------------------------
    @property
    def manager(self) -> ocp.CheckpointManager:
        """The persistent directory's manager (opened on first use)."""
        if self._manager is None:
            metric = self.best_metric
            policies: list[Any] = [ocm.LatestN(n=self.keep)]
            if self.keep_best:
                policies.append(
                    ocm.BestN(
                        get_metric_fn=lambda m: m[metric],
                        reverse=True,
                        n=1,
                        keep_checkpoints_without_metrics=False,
                    )
                )
            options = ocp.CheckpointManagerOptions(
                preservation_policy=ocm.AnyPreservationPolicy(policies),
                best_fn=lambda m: m.get(metric, float("inf")),
                best_mode="min",
                enable_async_checkpointing=False,  # our own thread keeps it off the loop
                # A read-only view of another run's directory must not touch its in-flight writes.
                cleanup_tmp_directories=not self.read_only,
                create=not self.read_only,
                read_only=self.read_only,
            )
            self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=_handlers())
        return self._manager

    @property
    def local_path(self) -> str:
        """This process's own local directory."""
        if self.local_directory is None:
            raise ValueError("Checkpoints: no local_directory was given")
        return os.path.join(self.local_directory, f"process_{jax.process_index()}")

    # --- what exists ----------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        """The steps in the persistent directory."""
        self.wait()
        return sorted(self.manager.all_steps()) if os.path.isdir(self.directory) else []

    @property
    def local_step(self) -> int | None:
        """The local step every process holds, or None (a collective with several processes)."""
        if self.local_directory is None:
            return None
        self.wait()
        mine = local_checkpoint.latest_step(self.local_path)
        if jax.process_count() == 1:
            return mine
        steps = multihost_utils.process_allgather(np.int64(-1 if mine is None else mine))
        steps = np.asarray(steps).reshape(-1)
        return int(steps[0]) if steps[0] >= 0 and np.all(steps == steps[0]) else None

    @property
    def latest(self) -> int | None:
        """The newest step a resume can read, local or persistent."""
        persistent = self.all_steps()
        candidates = [*persistent[-1:], *([self.local_step] if self.local_directory else [])]
        candidates = [s for s in candidates if s is not None]
        return max(candidates) if candidates else None

    @property
    def best(self) -> int | None:
        """The step with the lowest reported loss, or None when no save carried one."""
        if not self.all_steps():
            return None
        losses = {}
        for step in self.all_steps():
            metrics = self.manager.metrics(step)
            if metrics is not None and self.best_metric in metrics:
                losses[step] = float(metrics[self.best_metric])
        return min(losses, key=losses.__getitem__) if losses else None

    def path(self, step: int) -> str:
        """The persistent directory of ``step``."""
        return os.path.join(self.directory, str(step))

    def source(self, step: int) -> str:
        """The directory restore reads ``step`` from: this process's local one when the step is
        the local one every process holds, else the persistent one."""
        if self.local_directory is not None and self.local_step == step:
            return os.path.join(self.local_path, str(step))
        return self.path(step)

    # --- writing --------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: TrainState,
        saved: bytes | None,
        metrics: Mapping[str, float] | None = None,
        *,
        share: DataPartition | None = None,
    ) -> None:
        """Write ``state`` under ``step``, asynchronously.

        Sharded arrays go straight to orbax: no gather to the host. ``saved`` is the data
        stream's position as JSON bytes, stored as a uint8 row beside the ``share`` that read it
        (one row per process); a position without its share is refused. A write that fails
        surfaces from ``wait`` (or the next save); it is never swallowed.
        """
        self._writable()
        self.wait()  # one write in flight at most: a failed one stops here, memory stays bounded
        step = _step_number(step)
        rows = self._position_rows(saved, share)
        metrics = None if metrics is None else {k: float(v) for k, v in metrics.items()}
        snapshot = _snapshot(state)
        self._submit(self._write_persistent, step, snapshot, rows, metrics)

    def save_local(
        self, step: int, state: TrainState, saved: bytes | None, *, share: DataPartition | None = None
    ) -> None:
        """Write ``state`` under ``step`` to this process's local directory, asynchronously, in
        place of the local step before it. The placement rides along; a resume onto another one
        raises before reading shards from directories that do not hold them."""
        if self.local_directory is None:
            raise ValueError("Checkpoints.save_local: no local_directory was given")
        self._writable()
        self.wait()
        step = _step_number(step)
        if saved is not None and share is None:
            raise ValueError(_NO_SHARE)
        row = None if saved is None else layout.position_row(saved, share, len(saved))
        snapshot = _snapshot(state)
        self._submit(self._write_local, step, snapshot, row)

    def wait(self) -> None:
        """Block until pending writes (and uploads) have landed; re-raise the first that failed.

        Deliberately unguarded: a checkpoint that did not land is data loss, so its error stops
        the caller.
        """
        while self._inflight:
            self._inflight.pop(0).result()

    def close(self) -> None:
        """Wait for pending writes, then release the managers and the writer thread."""
        try:
            self.wait()
        finally:
            if self._manager is not None:
                self._manager.close()
            self._manager = None
            if self._worker is not None:
                self._worker.shutdown(wait=True)
                self._worker = None

    def clear(self) -> None:
        """Delete every checkpoint of this run: the persistent directory (by process 0) and this
        process's local one. Waits for pending writes first."""
        self._writable()
        self.wait()
        if self._manager is not None:
            self._manager.close()
            self._manager = None
        if jax.process_index() == 0 and os.path.isdir(self.directory):
            shutil.rmtree(self.directory)
        if self.local_directory is not None and os.path.isdir(self.local_path):
            shutil.rmtree(self.local_path)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("dew-checkpoints-clear")

    def _writable(self) -> None:
        if self.read_only:
            raise ValueError(f"Checkpoints: {self.directory} was opened read_only; it cannot be written")

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        if not self.asynchronous:
            fn(*args)
            return
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dew-checkpoints")
        self._inflight.append(self._worker.submit(fn, *args))

    def _position_rows(self, saved: bytes | None, share: DataPartition | None) -> dict[str, Any] | None:
        """The ``data`` item: one row per process, agreed across processes (a collective)."""
        if saved is not None and share is None:
            raise ValueError(_NO_SHARE)
        length = -1 if saved is None else len(saved)
        if jax.process_count() == 1:
            return None if saved is None else layout.position_row(saved, share, length)
        lengths = np.asarray(multihost_utils.process_allgather(np.int64(length))).reshape(-1)
        if (lengths < 0).any() != (lengths < 0).all():
            raise ValueError(
                "Checkpoints.save: every process must pass a data position or none; "
                f"position lengths by process: {lengths.tolist()}"
            )
        if saved is None:
            return None
        row = layout.position_row(saved, share, int(lengths.max()))
        count = jax.process_count()
        firsts = [
            min((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id) for p in range(count)
        ]
        sharding = jax.sharding.NamedSharding(
            jax.sharding.Mesh(np.array(firsts), ("process",)), jax.P("process")
        )
        return {
            k: jax.make_array_from_process_local_data(sharding, v, (count, *v.shape[1:]))
            for k, v in row.items()
        }

    def _write_persistent(
        self, step: int, state: TrainState, rows: dict[str, Any] | None, metrics: dict[str, float] | None
    ) -> None:
        """On the writer thread: one orbax checkpoint, landed (atomically renamed) on return."""
        _check_step(step, state)
        items = {
            "params": ocp.args.PyTreeSave(state.params),
            "opt_state": ocp.args.PyTreeSave(state.opt_state),
            "ema_params": ocp.args.PyTreeSave(state.ema),
            "extra": ocp.args.PyTreeSave(layout.extra(state)),
        }
        if state.pending is not None:
            items["pending"] = ocp.args.PyTreeSave(state.pending)
        if state.power_ema is not None:
            items["power_ema"] = ocp.args.PyTreeSave(state.power_ema)
        if rows is not None:
            items[layout.DATA_ITEM] = ocp.args.PyTreeSave(rows)
        # Orbax cannot write a tree without arrays (e.g. plain SGD's optimizer state): such an
        # item is recorded as empty instead, and restores as the template's own empty tree.
        empty = [name for name, arg in items.items() if not jax.tree.leaves(arg.item)]
        for name in empty:
            del items[name]
        custom = {
            "format": layout.FORMAT,
            "step": step,
            "process_count": jax.process_count(),
            "empty_items": empty,
        }
        if self.ema is not None:
            custom["ema"] = self.ema
        try:
            saved = self.manager.save(
                step, args=ocp.args.Composite(**items), metrics=metrics, custom_metadata=custom
            )
            self.manager.wait_until_finished()
        except Exception as e:
            raise CheckpointWriteError(f"checkpoint step {step} did not land in {self.directory}: {e}") from e
        if not saved:
            raise CheckpointWriteError(
                f"checkpoint step {step} was not written: {self.directory} already holds steps "
                f"{sorted(self.manager.all_steps())}; a run saves each step once, in increasing order"
            )
        if self.upload is not None:
            pending_upload = self.upload(self.path(step))
            if pending_upload is not None:
                pending_upload.result()

    def _write_local(self, step: int, state: TrainState, row: dict[str, np.ndarray] | None) -> None:
        """On the writer thread: this process's shards and their placement, host-local."""
        _check_step(step, state)
        shards, meta = local_checkpoint.describe(step, state)
        if self.ema is not None:
            meta["ema"] = self.ema
        try:
            local_checkpoint.write(self.local_path, step, shards, meta, row)
        except Exception as e:
            raise CheckpointWriteError(
                f"local checkpoint step {step} did not land in {self.local_path}: {e}"
            ) from e

    # --- reading --------------------------------------------------------------------------------
    def stored(self, step: int | None = None) -> TrainState:
        """What the checkpoint at ``step`` (default: latest) holds, without reading its values.

        Each state field comes back as a tree of ``jax.ShapeDtypeStruct`` (from a local
        checkpoint: a flat dict keyed by leaf name), and an unset field as None.
        """
        step = self._resolve(step)
        if self._is_local(step) and step not in self.all_steps():
            return self._stored_local(step)
        trees = self._stored_trees(step)
        trees.update({item: None for item in self._empty_items(step)})
        extra = trees["extra"]
        return TrainState(
            step=extra["step"],
            params=trees["params"],
            opt_state=trees["opt_state"],
            ema=trees["ema_params"],
            rng=extra["rng"],
            pending=trees.get("pending"),
            power_ema=_as_tuple(trees.get("power_ema")),
        )

    def accumulation_template(self, step: int) -> Any:
        """The persisted pending-array shapes at ``step``, without reading their values (None
        when that checkpoint holds no unfinished accumulation)."""
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
        every leaf as a host (numpy) array. A step that is the local one every process holds is
        read from the local directory, onto the placement it was written with; any other step
        from the persistent one. The position comes back as the bytes the reader of ``share``
        resumes from, or None without a share (or when the checkpoint stored none).
        """
        return self._restore(template, step, share=share, read_opt_state=True)

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
        if step is None and self.latest is None:
            return fresh, None
        template = jax.tree.map(_abstract, fresh)
        state, position = self._restore(template, step, share=share, read_opt_state=restore_optimizer_state)
        if not restore_optimizer_state:
            state = state.replace(opt_state=fresh.opt_state)
        if not restore_rng_key:
            state = state.replace(rng=fresh.rng)
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

        Reads only ``ema_params`` and ``extra``, never params or opt_state, and applies the
        correction the live loop uses, ``ema / (1 − Π β_i)`` over the optimizer updates behind
        the step (``step // accumulation``). The checkpoint records the run's EMA (β's law, the
        tracked leaves, the accumulation), so no further argument is needed; an explicit
        ``decay`` (a β or an ``EMASpec``) or ``accumulation`` that contradicts the record is an
        error, and one is required only for a checkpoint written without a record.
        ``template`` is a params tree (shape/dtype, optionally sharded), or None for host arrays.
        """
        if step is not None and (isinstance(step, bool | float) or not isinstance(step, int | np.integer)):
            raise TypeError(
                f"restore_ema: step must be an int or None, got {step!r}; the EMA's decay is recorded in "
                "the checkpoint (pass decay= only to check it)"
            )
        step = self._resolve(step)
        local = self._is_local(step) and step not in self.all_steps()
        recorded = (self._local_custom(step) if local else _custom_metadata(self.path(step))).get("ema")
        spec, k = _ema_to_use(recorded, decay, accumulation, f"checkpoint step {step} in {self.directory}")
        if local:
            if template is not None:
                raise CheckpointRestorationError(
                    f"checkpoint step {step} is only local: restore_ema reads it with template=None, "
                    "or restore the full state onto its placement"
                )
            state, _ = self.restore(None, step)
            return ema_lib.debias(state.ema, spec, num_updates(int(np.asarray(state.step)), k))
        restored = self._read_items(step, {"ema_params": template, "extra": None})
        count = int(np.asarray(restored["extra"]["step"]))
        self._check_step_metadata(step, count)
        return ema_lib.debias(restored["ema_params"], spec, num_updates(count, k))

    # --- reading: persistent ----------------------------------------------------------------------
    def _restore(
        self,
        template: TrainState | None,
        step: int | None,
        *,
        share: DataPartition | None,
        read_opt_state: bool,
    ) -> tuple[TrainState, bytes | None]:
        step = self._resolve(step)
        if self._is_local(step):
            problem = self._local_placement_problem(step, template)
            if _everywhere(problem is None):  # processes must agree, or their reads would diverge
                return self._restore_local(step, template, share)
            problem = problem or "another process's placement differs from the one it wrote"
            if step not in self.all_steps():
                raise CheckpointRestorationError(
                    f"checkpoint step {step} is only in the local directories ({self.local_path}) and "
                    f"cannot be restored onto this placement: {problem}"
                )
        present = self._present_items(step)
        wants_pending = template is not None and template.pending is not None
        if wants_pending and "pending" not in present:
            raise CheckpointRestorationError(
                f"checkpoint step {step}: the template has pending accumulation arrays, the checkpoint none"
            )
        if template is not None and not wants_pending and "pending" in present:
            raise CheckpointRestorationError(
                f"checkpoint step {step} holds an unfinished gradient accumulation; pass a template "
                "with pending arrays (see accumulation_template) to resume it"
            )
        items: dict[str, Any] = {
            "params": None if template is None else template.params,
            "ema_params": None if template is None else template.ema,
            "extra": None if template is None else {"step": template.step, "rng": template.rng},
        }
        if read_opt_state:
            items["opt_state"] = None if template is None else template.opt_state
        if "pending" in present:
            items["pending"] = None if template is None else template.pending
        wants_power = template is not None and template.power_ema is not None
        if wants_power and "power_ema" not in present:
            raise CheckpointRestorationError(
                f"checkpoint step {step} holds no power-EMA slots (config.ema.power_std_rels) for the "
                "template's; resume with the power-EMA profiles the run was trained with"
            )
        if "power_ema" in present and (template is None or wants_power):
            items["power_ema"] = None if template is None else template.power_ema
        if share is not None and layout.DATA_ITEM in present:
            items[layout.DATA_ITEM] = None
        restored = self._read_items(step, items)
        count = int(np.asarray(restored["extra"]["step"]))
        self._check_step_metadata(step, count)
        state = TrainState(
            step=restored["extra"]["step"],
            params=restored["params"],
            opt_state=restored.get("opt_state"),
            ema=restored["ema_params"],
            rng=restored["extra"]["rng"],
            pending=restored.get("pending"),
            power_ema=_as_tuple(restored.get("power_ema")),
        )
        position = None
        if layout.DATA_ITEM in restored:
            position = self._position(step, restored[layout.DATA_ITEM], share)
        return state, position

    def _read_items(self, step: int, templates: Mapping[str, Any]) -> dict[str, Any]:
        """Read the named items (template or None for host arrays), checking templates first."""
        empty = set(self._empty_items(step)) & set(templates)
        stored = self._stored_metadata(step, [item for item in templates if item not in empty])
        problems = []
        for item, template in templates.items():
            if item in empty:
                problems += layout.template_differences(item, template or {}, {})
            elif template is not None:
                problems += layout.template_differences(item, template, layout.stored_leaves(stored[item]))
        if problems:
            raise CheckpointRestorationError(
                f"checkpoint step {step}: the template differs from what is stored in "
                f"{len(problems)} leaves:\n  " + "\n  ".join(problems)
            )
        args = {item: _restore_args(templates[item], tree) for item, tree in stored.items()}
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as e:
            raise self._damaged(step, args, e) from e
        return {item: templates[item] if item in empty else restored[item] for item in templates}

    def _empty_items(self, step: int) -> list[str]:
        return list(_custom_metadata(self.path(step)).get("empty_items", []))

    def _damaged(self, step: int, args: Mapping[str, Any], error: Exception) -> CheckpointRestorationError:
        """Name the item a failed read came from by reading each on its own."""
        for item, arg in args.items():
            try:
                self.manager.restore(step, args=ocp.args.Composite(**{item: arg}))
            except Exception as e:  # orbax and tensorstore raise many types
                return CheckpointRestorationError(
                    f"checkpoint step {step} in {self.directory} is damaged: item {item!r} cannot be read "
                    f"({type(e).__name__}: {first_line(e)})"
                )
        return CheckpointRestorationError(
            f"checkpoint step {step} in {self.directory} cannot be read "
            f"({type(error).__name__}: {first_line(error)})"
        )

    def _stored_metadata(self, step: int, items: list[str] | None = None) -> dict[str, Any]:
        """The orbax metadata tree (shapes, dtypes; no values) of each named item, or of every
        item present. Only the named items are opened."""
        present = self._present_items(step)
        required = set(("params", "opt_state", "ema_params", "extra")) - set(self._empty_items(step))
        missing = [item for item in sorted(required) if item not in present]
        if missing:
            raise CheckpointRestorationError(
                f"checkpoint step {step} in {self.directory} is damaged: items {missing} are missing"
            )
        trees = {}
        for item in present if items is None else items:
            if item not in present:
                raise CheckpointRestorationError(
                    f"checkpoint step {step} in {self.directory} has no {item!r} item"
                )
            try:
                trees[item] = _metadata_reader().metadata(epath.Path(self.path(step)) / item).tree
            except Exception as e:
                raise CheckpointRestorationError(
                    f"checkpoint step {step} in {self.directory} is damaged: item {item!r} has unreadable "
                    f"metadata ({type(e).__name__}: {first_line(e)})"
                ) from e
        return trees

    def _stored_trees(self, step: int) -> dict[str, Any]:
        return {item: layout.shape_dtype_tree(tree) for item, tree in self._stored_metadata(step).items()}

    def _present_items(self, step: int) -> list[str]:
        names = [*layout.STATE_ITEMS, layout.DATA_ITEM]
        return [n for n in names if os.path.isdir(os.path.join(self.path(step), n))]

    def _check_step_metadata(self, step: int, count: int) -> None:
        """The restored step count must agree with the step the checkpoint was saved under."""
        recorded = _custom_metadata(self.path(step)).get("step")
        if recorded is None or int(recorded) != count or count != step:
            raise CheckpointRestorationError(
                f"checkpoint step {step} in {self.directory}: the restored state is at step {count}, "
                f"its metadata records step {recorded}"
            )

    def _position(self, step: int, data: Mapping[str, Any], share: DataPartition | None) -> bytes | None:
        if share is None:
            return None
        try:
            return layout.position_for(data, share, jax.process_index())
        except KeyError as e:
            raise CheckpointRestorationError(f"checkpoint step {step}: {e.args[0]}") from None

    def _resolve(self, step: int | None) -> int:
        self.wait()
        if step is None:
            step = self.latest
            if step is None:
                where = self.directory + (f" or {self.local_path}" if self.local_directory else "")
                raise CheckpointRestorationError(f"no checkpoint in {where}")
            return int(step)
        step = _step_number(step)
        if step not in self.all_steps() and not self._is_local(step):
            raise CheckpointRestorationError(
                f"no checkpoint for step {step} in {self.directory}; stored steps are {self.all_steps()}"
                + (f", local step {self.local_step}" if self.local_directory else "")
            )
        return step

    # --- reading: local ---------------------------------------------------------------------------
    def _is_local(self, step: int) -> bool:
        return self.local_directory is not None and self.local_step == step

    def _local_custom(self, step: int) -> dict[str, Any]:
        return local_checkpoint.read_meta(self.local_path, step)

    def _local_placement_problem(self, step: int, template: TrainState | None) -> str | None:
        return local_checkpoint.placement_problem(self._local_custom(step), template)

    def _restore_local(
        self, step: int, template: TrainState | None, share: DataPartition | None
    ) -> tuple[TrainState, bytes | None]:
        return local_checkpoint.restore(self.local_path, step, self._local_custom(step), template, share)

    def _stored_local(self, step: int) -> TrainState:
        return local_checkpoint.stored(self._local_custom(step))


_NO_SHARE = (
    "Checkpoints: a data position needs the share that read it (share=DataPartition(index, count)); "
    "no reader could be matched to a position without one"
)


# --- helpers ---------------------------------------------------------------------------------------
def _handlers() -> dict[str, ocp.PyTreeCheckpointHandler]:
    """One handler per item, so a fresh process knows how to read each one back."""
    return {name: ocp.PyTreeCheckpointHandler() for name in (*layout.STATE_ITEMS, layout.DATA_ITEM)}


@functools.cache
def _metadata_reader() -> ocp.PyTreeCheckpointHandler:
    """Reads an item's tree metadata on its own (built on first use: it queries the backend)."""
    return ocp.PyTreeCheckpointHandler()


def _custom_metadata(step_dir: str) -> dict[str, Any]:
    """The custom part of orbax's step metadata, read as the JSON file it is (no manager, and
    none of the items is opened)."""
    path = os.path.join(step_dir, _STEP_METADATA)
    try:
        with open(path) as f:
            custom = json.load(f).get("custom_metadata") or {}
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointRestorationError(
            f"checkpoint {step_dir} is damaged: its step metadata {_STEP_METADATA} cannot be read ({e})"
        ) from e
    if not isinstance(custom, dict):
        raise CheckpointRestorationError(f"checkpoint {step_dir} is damaged: custom metadata {custom!r:.100}")
    return custom


def _everywhere(ok: bool) -> bool:
    """Whether ``ok`` holds on every process (a collective with several processes)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.asarray(multihost_utils.process_allgather(np.int32(ok))).all())


def _step_number(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ValueError(f"Checkpoints: step must be an int >= 0, got {step!r}")
    return int(step)


def _check_step(step: int, state: TrainState) -> None:
    held = int(np.asarray(jax.device_get(state.step)))
    if held != step:
        raise ValueError(f"Checkpoints.save: step {step} but the state is at step {held}")


def _as_tuple(slots: Any) -> tuple[Any, ...] | None:
    """Power-EMA slots as the tuple ``TrainState`` holds (orbax returns a list without a template)."""
    return None if slots is None else tuple(slots)


def _abstract(leaf: Any) -> jax.ShapeDtypeStruct:
    dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
    return jax.ShapeDtypeStruct(np.shape(leaf), dtype, sharding=getattr(leaf, "sharding", None))


def _snapshot(state: TrainState) -> TrainState:
    """A copy of the state's arrays, dispatched (not waited for) on their own devices.

    The jitted step donates its input, so the writer thread must not read the live buffers;
    the copy is queued on the devices and the loop goes on. Host leaves are copied on the host.
    """
    leaves, treedef = jax.tree.flatten(state)
    on_device = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    copies = jax.device_put(
        [leaves[i] for i in on_device], [leaves[i].sharding for i in on_device], may_alias=False
    )
    out = [x if isinstance(x, jax.Array) else np.array(x, copy=True) for x in leaves]
    for i, copy in zip(on_device, copies, strict=True):
        out[i] = copy
    return jax.tree.unflatten(treedef, out)


def _restore_args(template: Any, stored_tree: Any) -> ocp.args.PyTreeRestore:
    """Placed arrays for a template (its shardings, else the default device); else host arrays."""
    if template is None:
        restore_args = jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
            stored_tree,
            is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"),
        )
        return ocp.args.PyTreeRestore(restore_args=restore_args)
    item = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(
            tuple(leaf.shape),
            leaf.dtype,
            sharding=getattr(leaf, "sharding", None) or layout.default_sharding(),
        ),
        template,
    )
    restore_args = jax.tree.map(
        lambda leaf: ocp.ArrayRestoreArgs(sharding=leaf.sharding, global_shape=leaf.shape, dtype=leaf.dtype),
        item,
    )
    return ocp.args.PyTreeRestore(item=item, restore_args=restore_args)


def _ema_to_use(
    recorded: Mapping[str, Any] | None,
    decay: float | EMASpec | None,
    accumulation: int | None,
    where: str,
) -> tuple[EMASpec, int]:
    """The EMASpec and accumulation to debias with: the recorded ones, checked against any
    explicit argument; without a record, the arguments (a decay is then required)."""
    if recorded is None:
        if decay is None:
            raise CheckpointRestorationError(
                f"{where} records no EMA (written before runs recorded it): pass decay= (the run's β or "
                "EMASpec) and accumulation="
            )
        spec = decay if isinstance(decay, EMASpec) else EMASpec(decay=float(decay))
        return spec, 1 if accumulation is None else int(accumulation)
    spec, k = ema_lib.from_record(recorded)
    if decay is not None:
        given = decay if isinstance(decay, EMASpec) else EMASpec(decay=float(decay))
        if not ema_lib.same_law(given, spec):
            raise ValueError(
                f"restore_ema: decay={decay!r} contradicts the EMA {where} records (decay={spec.decay}, "
                f"half_life={spec.half_life}, ramp_up={spec.ramp_up}); leave decay unset to use the record"
            )
    if accumulation is not None and int(accumulation) != k:
        raise ValueError(
            f"restore_ema: accumulation={accumulation} contradicts the {k} micro-batches per update {where} "
            "records; leave it unset to use the record"
        )
    return spec, k


def get_debiased_ema(ema_params: Any, decay: float, num_updates: int | jax.Array) -> Any:
    """Bias-corrected EMA (Adam convention): ``ema / (1 - decay ** num_updates)``.

    Assumes ``ema_params`` was zero-initialised and updated ``num_updates`` times; must not be
    called with ``num_updates == 0``.
    """
    return ema_lib.debias(ema_params, decay, num_updates)


__all__ = [
    "RUN_METADATA",
    "CheckpointRestorationError",
    "CheckpointWriteError",
    "Checkpoints",
    "get_debiased_ema",
    "read_run_metadata",
    "save_run_metadata",
]
