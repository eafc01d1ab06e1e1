"""``Checkpoints``: one run's checkpoints in one directory, written asynchronously by orbax.

On disk each step is one orbax checkpoint of separately restorable items:

    params/      the live parameters
    opt_state/   the optimizer state
    ema_params/  the raw (not debiased) EMA, so ``restore_ema`` needs neither of the above
    extra/       the small scalars: step, rng key
    data/        the data position: JSON bytes as uint8 rows, one per process share (optional)
    pending/     gradient sums of a run accumulating micro-batches (``TrainState.pending``; only
                 for such runs)

Everything is arrays and JSON; nothing written or read is pickled, so loading a checkpoint can
never execute code.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

from dew.data.dataset import DataPartition
from dew.training import ema as ema_lib
from dew.training.state import TrainState

_STATE_ITEMS = {"params": "params", "opt_state": "opt_state", "ema_params": "ema", "extra": None}
RUN_METADATA = "run.json"


class _MetriclessSaveFilter(logging.Filter):
    """A save without metrics is a supported case (it is never ranked best), not a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Requested `tracked_metric`; did not provide metrics" not in record.getMessage()


logging.getLogger("absl").addFilter(_MetriclessSaveFilter())


class CheckpointRestorationError(Exception):
    """A restore was asked for and cannot be done as asked (nothing, or the wrong thing, stored)."""


class Checkpoints:
    """Holds the checkpoints of one run, in one directory.

    Constructing one opens nothing; the orbax manager is created on first use. The directory
    keeps the latest ``keep`` steps, so a resume has something recent, plus the step with the
    lowest ``best_metric`` a save reported. A save without metrics can never become the best.
    """

    def __init__(self, directory: str, *, keep: int = 2, best_metric: str = "loss"):
        if keep < 1:
            raise ValueError(f"Checkpoints: keep must be >= 1, got {keep}")
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.best_metric = best_metric
        self._manager: ocp.CheckpointManager | None = None

    # --- the orbax manager ---------------------------------------------------------------------
    @property
    def manager(self) -> ocp.CheckpointManager:
        if self._manager is None:
            metric = self.best_metric
            policy = ocm.AnyPreservationPolicy(
                [
                    ocm.LatestN(n=self.keep),
                    ocm.BestN(
                        get_metric_fn=lambda m: m[metric],
                        reverse=True,
                        n=1,
                        keep_checkpoints_without_metrics=False,
                    ),
                ]
            )
            options = ocp.CheckpointManagerOptions(
                preservation_policy=policy,
                best_fn=lambda m: m.get(metric, float("inf")),
                best_mode="min",
                enable_async_checkpointing=True,
                create=True,
            )
            handlers = {name: ocp.StandardCheckpointHandler() for name in (*_STATE_ITEMS, "data", "pending")}
            self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
        return self._manager

    # --- what exists ----------------------------------------------------------------------------
    @property
    def latest(self) -> int | None:
        """The newest step a resume can read."""
        if not os.path.isdir(self.directory):
            return None
        return self.manager.latest_step()

    @property
    def best(self) -> int | None:
        """The step with the lowest reported loss, or None when no save carried one."""
        if not os.path.isdir(self.directory):
            return None
        with_metric = [
            info
            for info in self.manager._checkpoints
            if info.metrics is not None and self.best_metric in info.metrics
        ]
        if not with_metric:
            return None
        return min(with_metric, key=lambda info: info.metrics[self.best_metric]).step

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps()) if os.path.isdir(self.directory) else []

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    # --- writing ----------------------------------------------------------------------------
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

        Sharded arrays go straight to orbax (no gather to host). ``saved`` is the data stream's
        position as JSON bytes, stored as uint8 rows beside the share that read it. A write that
        fails surfaces from ``wait`` (or the next save); it is never swallowed.
        """
        if int(step) != int(jax.device_get(state.step)):
            raise ValueError(f"Checkpoints.save: step {step} but the state is at step {int(state.step)}")
        if saved is not None and share is None:
            share = DataPartition()
        items = {
            "params": ocp.args.StandardSave(state.params),
            "opt_state": ocp.args.StandardSave(state.opt_state),
            "ema_params": ocp.args.StandardSave(state.ema),
            "extra": ocp.args.StandardSave(_extra(state)),
        }
        if saved is not None:
            items["data"] = ocp.args.StandardSave(_position_rows(saved, share))
        if state.pending is not None:
            items["pending"] = ocp.args.StandardSave(state.pending)
        metrics = None if metrics is None else {k: float(v) for k, v in metrics.items()}
        self.manager.save(int(step), args=ocp.args.Composite(**items), metrics=metrics)

    def wait(self) -> None:
        """Block until pending async writes have landed on disk; re-raises a failed write."""
        if self._manager is not None:
            self._manager.wait_until_finished()

    def close(self) -> None:
        if self._manager is not None:
            self._manager.wait_until_finished()
            self._manager.close()
            self._manager = None

    # --- reading ----------------------------------------------------------------------------
    def restore(
        self,
        template: TrainState | None = None,
        step: int | None = None,
        *,
        share: DataPartition | None = None,
    ) -> tuple[TrainState, bytes | None]:
        """Restore the state at ``step`` (default: latest) and the data position of ``share``.

        ``template`` is a TrainState of ``jax.ShapeDtypeStruct``; a leaf's sharding, when set,
        is where the array is placed. ``None`` restores every leaf as a host (numpy) array.
        """
        self.wait()
        step = self._resolve(step)
        args = {
            item: _restore_args(None if template is None else _template_item(template, item))
            for item in _STATE_ITEMS
        }
        has_data = self._has_item(step, "data")
        if has_data:
            args["data"] = _restore_args(None)
        wants_pending = template is None or template.pending is not None
        if wants_pending and self._has_item(step, "pending"):
            args["pending"] = _restore_args(None if template is None else template.pending)
        elif template is not None and template.pending is not None:
            raise CheckpointRestorationError(
                f"checkpoint step {step} holds no pending accumulation sums, but the template asks "
                "for them (the run accumulates micro-batches; this checkpoint was written without)"
            )
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as e:  # orbax raises many types; name the step and the cause.
            raise CheckpointRestorationError(f"checkpoint step {step} in {self.directory}: {e}") from e
        restored = {name: restored[name] for name in args}
        if template is None:
            restored = jax.device_get(restored)
        state = TrainState(
            step=restored["extra"]["step"],
            params=restored["params"],
            opt_state=restored["opt_state"],
            ema=restored["ema_params"],
            rng=restored["extra"]["rng"],
            pending=restored.get("pending"),
        )
        if int(np.asarray(state.step)) != step:
            raise CheckpointRestorationError(
                f"checkpoint step {step} holds a state at step {int(np.asarray(state.step))}"
            )
        position = _row_for(restored["data"], share or DataPartition()) if has_data else None
        return state, position

    def restore_ema(self, template: Any, decay: float, step: int | None = None) -> Any:
        """The debiased EMA parameters at ``step``, reading only ``ema_params`` and ``extra``."""
        self.wait()
        step = self._resolve(step)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(ema_params=_restore_args(template), extra=_restore_args(None)),
        )
        return ema_lib.debias(restored["ema_params"], decay, int(restored["extra"]["step"]))

    def _resolve(self, step: int | None) -> int:
        if step is None:
            step = self.latest
            if step is None:
                raise CheckpointRestorationError(f"no checkpoint in {self.directory}")
        elif step not in self.all_steps():
            raise CheckpointRestorationError(
                f"no checkpoint for step {step} in {self.directory}; stored steps are {self.all_steps()}"
            )
        return int(step)

    def _has_item(self, step: int, item: str) -> bool:
        return os.path.isdir(os.path.join(self.path(step), item))


# --- helpers: the on-disk layout ------------------------------------------------------------------
def _extra(state: TrainState) -> dict[str, jax.Array]:
    return {"step": state.step, "rng": state.rng}


def _template_item(template: TrainState, item: str) -> Any:
    field = _STATE_ITEMS[item]
    if field is not None:
        return getattr(template, field)
    return {"step": template.step, "rng": template.rng}


def _restore_args(template: Any) -> ocp.args.StandardRestore:
    if template is None:
        return ocp.args.StandardRestore()
    return ocp.args.StandardRestore(jax.tree.map(_placed, template))


def _placed(leaf: Any) -> jax.ShapeDtypeStruct:
    """A template leaf with a sharding; unsharded leaves land on the default device."""
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def _position_rows(saved: bytes, share: DataPartition) -> dict[str, np.ndarray]:
    """JSON bytes as one uint8 row per share (tensorstore has no bytes dtype)."""
    raw = np.frombuffer(bytes(saved), dtype=np.uint8)
    return {
        "rows": raw[None, :],
        "lengths": np.array([raw.size], np.int32),
        "share_index": np.array([share.index], np.int32),
        "share_count": np.array([share.count], np.int32),
    }


def _row_for(data: Mapping[str, Any], share: DataPartition) -> bytes:
    index, count = np.asarray(data["share_index"]), np.asarray(data["share_count"])
    matches = np.flatnonzero((index == share.index) & (count == share.count))
    if matches.size == 0:
        stored = list(zip(index.tolist(), count.tolist(), strict=True))
        raise CheckpointRestorationError(
            f"no data position for share {share.index}/{share.count}; stored shares are {stored}"
        )
    row = matches[0]
    return bytes(np.asarray(data["rows"])[row, : int(np.asarray(data["lengths"])[row])].tobytes())


# --- run metadata: a JSON file beside checkpoints/, read without any orbax manager -------------
def save_run_metadata(run_dir: str, metadata: Mapping[str, Any]) -> None:
    """Persist run-level metadata as JSON at the run root, atomically (write, then rename)."""
    os.makedirs(run_dir, exist_ok=True)
    text = json.dumps(metadata, indent=2, sort_keys=True)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".run.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(run_dir, RUN_METADATA))


def read_run_metadata(run_dir: str) -> dict[str, Any] | None:
    """Metadata written by ``save_run_metadata``, or None if absent. Never opens a manager, so
    it cannot race a live run's in-flight checkpoint save."""
    path = os.path.join(run_dir, RUN_METADATA)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
