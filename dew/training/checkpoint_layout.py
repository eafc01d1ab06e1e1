"""The on-disk layout of a dew checkpoint, as pure helpers ``Checkpoints`` composes.

Three jobs live here, none of which touches a checkpoint manager:

* data positions: JSON bytes <-> uint8 rows, one row per process with the share it read;
* templates: naming state leaves the way orbax names them, and listing every leaf in which a
  template differs from what a checkpoint holds (before any value is read);
* local shards: what one process's devices hold of each leaf, and the placement they were
  written with, so a local checkpoint is only ever reassembled onto that same placement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

from dew.data.dataset import DataPartition
from dew.training.state import TrainState

# The separately restorable items of a checkpoint, and the TrainState field each one holds.
STATE_ITEMS: dict[str, str | None] = {
    "params": "params",
    "opt_state": "opt_state",
    "ema_params": "ema",
    "extra": None,  # the small scalars: step and rng key
    "pending": "pending",  # gradient sums of an unfinished accumulation (only when set)
    "power_ema": "power_ema",  # post-hoc EMA profiles (only when the run tracks them)
}
DATA_ITEM = "data"
FORMAT = "dew-checkpoint/1"


# --- data positions ------------------------------------------------------------------------------
def position_row(saved: bytes, share: DataPartition, width: int) -> dict[str, np.ndarray]:
    """This process's row: the position bytes zero-padded to ``width``, with its share.

    Tensorstore has no bytes dtype, so the JSON rides along as uint8; the length keeps trailing
    zero bytes of the JSON itself apart from the padding.
    """
    raw = np.frombuffer(bytes(saved), dtype=np.uint8)
    row = np.zeros((1, width), np.uint8)
    row[0, : raw.size] = raw
    return {
        "rows": row,
        "lengths": np.array([raw.size], np.int32),
        "share_index": np.array([share.index], np.int32),
        "share_count": np.array([share.count], np.int32),
    }


def position_for(data: Mapping[str, Any], share: DataPartition, process_index: int) -> bytes:
    """The bytes the reader of ``share`` resumes from.

    Rows are told apart by the share they were read with; when several processes read the same
    share (a global position), this process's own row is preferred, else the first match.
    """
    index, count = np.asarray(data["share_index"]), np.asarray(data["share_count"])
    matches = np.flatnonzero((index == share.index) & (count == share.count))
    if matches.size == 0:
        stored = [f"{i}/{c}" for i, c in zip(index.tolist(), count.tolist(), strict=True)]
        raise KeyError(f"no data position for share {share.index}/{share.count}; stored shares are {stored}")
    row = process_index if process_index in matches else int(matches[0])
    length = int(np.asarray(data["lengths"])[row])
    return bytes(np.asarray(data["rows"])[row, :length].tobytes())


# --- naming leaves the way orbax does ------------------------------------------------------------
def _key_name(key: Any) -> str:
    if isinstance(key, DictKey):
        return str(key.key)
    if isinstance(key, GetAttrKey):
        return key.name
    if isinstance(key, SequenceKey | FlattenedIndexKey):
        return str(key.idx)
    return str(key)


def leaf_names(tree: Any) -> dict[str, Any]:
    """``{"0.mu.w": leaf, ...}``: dotted paths, the names orbax gives the leaves it stores."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(_key_name(k) for k in path): leaf for path, leaf in flat}


def stored_leaves(metadata_tree: Any) -> dict[str, Any]:
    """Flatten an orbax metadata tree to ``{dotted name: ArrayMetadata}`` (empty nodes dropped)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(metadata_tree)
    return {".".join(_key_name(k) for k in path): leaf for path, leaf in flat if leaf is not None}


def template_differences(item: str, template: Any, stored: Mapping[str, Any]) -> list[str]:
    """Every leaf in which ``template`` differs from what the checkpoint stores, by name.

    Structure (a leaf only one side has), shape and dtype are compared; an empty list means the
    template can be restored as is.
    """
    wanted = leaf_names(template)
    problems = []
    for name in sorted(set(wanted) | set(stored)):
        if name not in stored:
            problems.append(f"{item}.{name}: in the template, not in the checkpoint")
        elif name not in wanted:
            problems.append(f"{item}.{name}: in the checkpoint, not in the template")
        else:
            w, s = wanted[name], stored[name]
            if tuple(w.shape) != tuple(s.shape):
                problems.append(f"{item}.{name}: template shape {tuple(w.shape)}, stored {tuple(s.shape)}")
            elif np.dtype(w.dtype) != np.dtype(s.dtype):
                problems.append(
                    f"{item}.{name}: template dtype {np.dtype(w.dtype)}, stored {np.dtype(s.dtype)}"
                )
    return problems


def shape_dtype_tree(metadata_tree: Any) -> Any:
    """An orbax metadata tree as ``jax.ShapeDtypeStruct`` leaves (no values read)."""
    return jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), np.dtype(m.dtype)),
        metadata_tree,
        is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"),
    )


# --- local shards and their placement ------------------------------------------------------------
def _index_key(index: tuple[slice, ...], shape: Sequence[int]) -> list[list[int]]:
    return [[*s.indices(n)[:2]] for s, n in zip(index, shape, strict=True)]


def leaf_placement(shape: Sequence[int], sharding: jax.sharding.Sharding) -> dict[str, Any]:
    """Which part of a ``shape`` array each of this process's devices holds, as JSON."""
    devices = sharding.addressable_devices_indices_map(tuple(shape))
    return {
        "shape": list(shape),
        "devices": {
            str(d.id): _index_key(idx, shape) for d, idx in sorted(devices.items(), key=lambda kv: kv[0].id)
        },
    }


def placement_of(tree: Any) -> dict[str, Any]:
    """The placement of every array leaf of ``tree`` on this process, by leaf name."""
    out = {}
    for name, leaf in leaf_names(tree).items():
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            raise ValueError(f"leaf {name!r} has no sharding; a local checkpoint needs placed arrays")
        out[name] = leaf_placement(leaf.shape, sharding)
    return out


def unique_local_shards(array: jax.Array) -> dict[str, jax.Array]:
    """One single-device array per distinct region this process holds (replicas written once),
    keyed by the region (``"0:4,0:2"``)."""
    shards: dict[str, jax.Array] = {}
    for shard in sorted(array.addressable_shards, key=lambda s: s.device.id):
        key = region_key(_index_key(shard.index, array.shape))
        shards.setdefault(key, shard.data)
    return shards


def region_key(region: list[list[int]]) -> str:
    return ",".join(f"{a}:{b}" for a, b in region) or "scalar"


def extra(state: TrainState) -> dict[str, Any]:
    """The small scalars of the ``extra`` item."""
    return {"step": state.step, "rng": state.rng}


def state_tree(state: TrainState) -> dict[str, Any]:
    """Every state leaf under one dict, as a local checkpoint names them (``params.w``, ...)."""
    tree = {"params": state.params, "opt_state": state.opt_state, "ema": state.ema, "extra": extra(state)}
    if state.pending is not None:
        tree["pending"] = state.pending
    if state.power_ema is not None:
        tree["power_ema"] = state.power_ema
    return tree


def default_sharding() -> jax.sharding.Sharding:
    """Where a template leaf without a sharding is placed: this process's first device."""
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
