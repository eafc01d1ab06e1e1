"""Power-function EMAs tracked during training, and their snapshots on disk (EDM2 post-hoc EMA).

``PowerEMA`` names the profiles (std_rel values, e.g. 0.05 and 0.10) a run tracks: each is one
extra EMA slot of ``TrainState.power_ema``, updated inside the pure step with β_γ(n) =
(1 − 1/n)^(γ+1) at the n-th optimizer update (``dew.averaging.posthoc``, Eq. 127). Such an
average needs no debiasing (β_γ(1) = 0).

``PowerEMASnapshots`` keeps every snapshot of the slots (one orbax checkpoint per snapshot
step under ``<workdir>/power_ema``, one item per profile, ``std_rel_0.050``-style; never
garbage-collected: the reconstruction needs all of them), and ``dew.training.stages.SnapshotStage`` writes one
every ``snapshot_every`` train steps. ``python -m dew.phema`` reconstructs any std_rel from them.

Directory layout::

    <workdir>/power_ema/<step>/std_rel_0.050/   the std_rel = 0.05 slot after <step> train steps
                               std_rel_0.100/
                               _CHECKPOINT_METADATA  custom: {"updates": n, "std_rels": [...]}
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from dew.averaging import posthoc as posthoc_ema

Params = Any
SNAPSHOT_DIR = "power_ema"
_ITEM_PREFIX = "std_rel_"


@dataclasses.dataclass(frozen=True)
class PowerEMA:
    """The power-EMA profiles a run tracks (``std_rels``) and how often (train steps) their
    snapshots are saved (``snapshot_every``)."""

    std_rels: tuple[float, ...]
    snapshot_every: int
    #: Where its slots live (``dew.averaging.averager.FIELDS``): ``TrainState.power_ema``, item ``power_ema``.
    field: ClassVar[str] = "power_ema"
    item: ClassVar[str] = "power_ema"
    name: ClassVar[str] = "power_ema"

    def __post_init__(self) -> None:
        object.__setattr__(self, "std_rels", posthoc_ema.parse_std_rels(self.std_rels, "std_rels"))
        if not self.std_rels:
            raise ValueError("PowerEMA: std_rels is empty; give at least one std_rel (EDM2: 0.05, 0.10)")
        if not isinstance(self.snapshot_every, int) or self.snapshot_every < 1:
            raise ValueError(
                f"PowerEMA.snapshot_every must be an int >= 1 (train steps), got {self.snapshot_every!r}"
            )

    @property
    def gammas(self) -> tuple[float, ...]:
        return tuple(float(posthoc_ema.std_rel_to_gamma(s)) for s in self.std_rels)

    def init(self, params: Params) -> tuple[Params, ...]:
        """Zero slots, one per profile (the first update replaces them)."""
        return tuple(jax.tree.map(jnp.zeros_like, params) for _ in self.std_rels)

    def update(self, slots: tuple[Params, ...], params: Params, n: jax.Array | int) -> tuple[Params, ...]:
        """Every slot after the ``n``-th optimizer update (n ≥ 1); pure, runs inside jit."""
        return tuple(
            posthoc_ema.power_update(slot, params, gamma, n)
            for slot, gamma in zip(slots, self.gammas, strict=True)
        )

    def read(self, slots: tuple[Params, ...], n: jax.Array | int = 1) -> list[tuple[Params, str]]:
        """Every profile's slot as it stands (a power EMA needs no debiasing: β_γ(1) = 0), named
        by its snapshot item (``std_rel_0.050``)."""
        return [(slot, item_name(s)) for slot, s in zip(slots, self.std_rels, strict=True)]

    def record(self, params: Params = None, accumulation: int = 1) -> dict[str, Any]:
        """The profiles and snapshot cadence, as JSON."""
        return {"std_rels": list(self.std_rels), "snapshot_every": int(self.snapshot_every)}


def power_ema_from_config(c: Any) -> PowerEMA | None:
    """``config.ema.power_std_rels`` (() = off) and ``config.ema.snapshot_every`` (train steps;
    0 = every ``config.checkpoint.every``) of a resolved config."""
    if not tuple(c.ema.power_std_rels):
        return None
    return PowerEMA(tuple(c.ema.power_std_rels), c.ema.snapshot_every or c.checkpoint.every)


def item_name(std_rel: float) -> str:
    return _ITEM_PREFIX + posthoc_ema.std_rel_key(std_rel)


class PowerEMASnapshots:
    """Every power-EMA snapshot of a run, as orbax checkpoints under ``directory``.

    ``save`` is synchronous (a snapshot is one copy of the params per profile); ``snapshots``
    reads them all back as host arrays for ``posthoc_ema.reconstruct``.
    """

    def __init__(self, directory: str, *, read_only: bool = False):
        import orbax.checkpoint as ocp

        self.directory = os.path.abspath(directory)
        self.read_only = read_only
        if read_only and not os.path.isdir(self.directory):
            raise FileNotFoundError(
                f"no power-EMA snapshots at {self.directory}: train with config.ema.power_std_rels "
                "set (e.g. (0.05, 0.1)) so the run saves them"
            )
        options = ocp.CheckpointManagerOptions(
            create=not read_only, read_only=read_only, enable_async_checkpointing=False
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, updates: int, power: PowerEMA, slots: Sequence[Params]) -> None:
        """Write the slots after ``step`` train steps (= ``updates`` optimizer updates)."""
        import orbax.checkpoint as ocp

        items = {
            item_name(s): ocp.args.PyTreeSave(slot) for s, slot in zip(power.std_rels, slots, strict=True)
        }
        custom = {"updates": int(updates), "std_rels": list(power.std_rels)}
        self.manager.save(step, args=ocp.args.Composite(**items), custom_metadata=custom, force=True)
        self.manager.wait_until_finished()

    def discard_after(self, step: int) -> None:
        """Delete snapshots newer than ``step`` (a resumed run writes them again from there)."""
        for s in self.steps():
            if s > step:
                self.manager.delete(s)

    def metadata(self, step: int) -> dict[str, Any]:
        """The snapshot's record, ``{"updates": n >= 0, "std_rels": [σ_rel > 0, ...]}``, checked
        when read: anything else is a ``SnapshotError`` naming the file."""
        path = os.path.join(self.directory, str(step), "_CHECKPOINT_METADATA")
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError) as e:
            raise SnapshotError(f"power-EMA snapshot record {path} cannot be read: {e}") from None
        custom = record.get("custom_metadata") if isinstance(record, dict) else None
        if not isinstance(custom, dict):
            raise SnapshotError(f"power-EMA snapshot record {path} holds no custom_metadata object")
        updates, std_rels = custom.get("updates"), custom.get("std_rels")
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 0:
            raise SnapshotError(f"power-EMA snapshot record {path}: updates={updates!r}, not an int >= 0")
        try:
            if not isinstance(std_rels, list) or not std_rels:
                raise ValueError("expected a non-empty list")
            posthoc_ema.parse_std_rels(std_rels, "std_rels")
        except (TypeError, ValueError) as e:
            raise SnapshotError(f"power-EMA snapshot record {path}: std_rels={std_rels!r}: {e}") from None
        return custom

    def snapshots(self) -> list[posthoc_ema.Snapshot]:
        """All snapshots with t = their optimizer-update count > 0, params as host arrays. Each is
        checked as read: its record (``metadata``), its items present and readable, every
        snapshot's parameters of one structure and shape, and all finite; a damaged one is a
        ``SnapshotError`` naming it (the reconstruction would otherwise be silently wrong)."""
        import orbax.checkpoint as ocp
        from etils import epath

        out: list[posthoc_ema.Snapshot] = []
        for step in self.steps():
            meta = self.metadata(step)
            if meta["updates"] < 1:
                continue
            names = [item_name(s) for s in meta["std_rels"]]
            where = os.path.join(self.directory, str(step))
            try:
                args = {}
                for name in names:
                    stored = ocp.PyTreeCheckpointHandler().metadata(epath.Path(where) / name)
                    tree = getattr(stored, "tree", stored)
                    restore_args = jax.tree.map(
                        lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                        tree,
                        is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"),
                    )
                    args[name] = ocp.args.PyTreeRestore(restore_args=restore_args)
                restored = self.manager.restore(step, args=ocp.args.Composite(**args))
            except Exception as e:  # orbax's errors name no file a user would look at
                raise SnapshotError(
                    f"power-EMA snapshot {where} cannot be read ({type(e).__name__}: {str(e)[:200]})"
                ) from None
            for std_rel, name in zip(meta["std_rels"], names, strict=True):
                snapshot = posthoc_ema.Snapshot(int(meta["updates"]), float(std_rel), restored[name])
                _check_like(snapshot, out[0] if out else None, os.path.join(where, name))
                out.append(snapshot)
        return out

    def close(self) -> None:
        self.manager.close()

    def clear(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class SnapshotError(ValueError):
    """A power-EMA snapshot that cannot be used as it is on disk; the message names it."""


def _check_like(snapshot: posthoc_ema.Snapshot, first: posthoc_ema.Snapshot | None, where: str) -> None:
    """The snapshot's parameters are finite and shaped like the first snapshot's."""
    leaves = jax.tree.leaves(snapshot.params)
    bad = [i for i, leaf in enumerate(leaves) if not np.all(np.isfinite(leaf))]
    if bad:
        raise SnapshotError(f"power-EMA snapshot {where} holds non-finite parameters ({len(bad)} arrays)")
    if first is None:
        return
    shapes = jax.tree.map(np.shape, snapshot.params)
    expected = jax.tree.map(np.shape, first.params)
    if jax.tree.structure(shapes) != jax.tree.structure(expected) or shapes != expected:
        raise SnapshotError(
            f"power-EMA snapshot {where} does not match the run's other snapshots (parameter names or "
            "shapes differ); it is not this run's"
        )


__all__ = [
    "SNAPSHOT_DIR",
    "PowerEMA",
    "PowerEMASnapshots",
    "SnapshotError",
    "item_name",
    "power_ema_from_config",
]
