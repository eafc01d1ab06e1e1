"""One process's local checkpoint: the shards its own devices hold, as ``.npy`` files, plus a
JSON file saying where each shard sits (the placement) and the step it belongs to.

Why not orbax here: orbax writes host numpy arrays from process 0 only and refuses arrays that
live on one process's devices, while a local checkpoint is written and read by its own process
alone. The format is deliberately plain: ``numpy.save``/``numpy.load`` with
``allow_pickle=False`` (no pickle can be written or read) and one JSON file.

A step lands atomically: everything is written (and fsynced) into a temporary directory that
is then renamed to the step's name, so a directory named by a step is always complete. The
previous step is removed after the new one has landed.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from dew.training import checkpoint_layout as layout
from dew.training.state import TrainState

META = "placement.json"
_TMP = ".tmp-"


def _sync_write(path: str, write: Any) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write(
    root: str,
    step: int,
    shards: Sequence[Sequence[np.ndarray]],
    meta: Mapping[str, Any],
    data: Mapping[str, np.ndarray] | None,
) -> str:
    """Write ``step`` under ``root`` in place of the step before it; return its directory."""
    os.makedirs(root, exist_ok=True)
    tmp = os.path.join(root, f"{_TMP}{step}-{uuid.uuid4().hex}")
    os.makedirs(tmp)
    for i, leaf in enumerate(shards):
        for j, shard in enumerate(leaf):
            _sync_write(
                os.path.join(tmp, f"leaf{i}.shard{j}.npy"),
                lambda f, a=shard: np.save(f, a, allow_pickle=False),
            )
    for key, value in (data or {}).items():
        _sync_write(
            os.path.join(tmp, f"data.{key}.npy"), lambda f, a=value: np.save(f, a, allow_pickle=False)
        )
    _sync_write(os.path.join(tmp, META), lambda f: f.write(json.dumps(meta).encode()))
    final = os.path.join(root, str(step))
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    dir_fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for name in os.listdir(root):
        if name != str(step):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return final


def latest_step(root: str) -> int | None:
    """The step that has landed under ``root`` (temporary directories never count)."""
    if not os.path.isdir(root):
        return None
    steps = [int(n) for n in os.listdir(root) if n.isdigit() and os.path.isfile(os.path.join(root, n, META))]
    return max(steps) if steps else None


def read_meta(root: str, step: int) -> dict[str, Any]:
    with open(os.path.join(root, str(step), META)) as f:
        return json.load(f)


def read_shards(root: str, step: int, meta: Mapping[str, Any]) -> list[list[np.ndarray]]:
    """Every shard of every leaf, in the order the placement lists them."""
    directory = os.path.join(root, str(step))
    return [
        [
            np.load(os.path.join(directory, f"leaf{i}.shard{j}.npy"), allow_pickle=False)
            for j in range(len(leaf["regions"]))
        ]
        for i, leaf in enumerate(meta["placement"])
    ]


def read_data(root: str, step: int) -> dict[str, np.ndarray] | None:
    """The position row this process stored, or None."""
    directory = os.path.join(root, str(step))
    keys = sorted(n[len("data.") : -len(".npy")] for n in os.listdir(directory) if n.startswith("data."))
    if not keys:
        return None
    return {k: np.load(os.path.join(directory, f"data.{k}.npy"), allow_pickle=False) for k in keys}


# --- reassembling a state from this process's shards -------------------------------------------
def local_tree_from_names(names: list[str], values: Mapping[str, Any]) -> dict[str, Any]:
    """Nested dicts from dotted names; the caller restores a template's own structure."""
    tree: dict[str, Any] = {"params": {}, "opt_state": {}, "ema": {}, "extra": {}}
    for name in names:
        parts = name.split(".")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = values[name]
    return tree


def restructure(state: TrainState, template: TrainState) -> TrainState:
    """Put leaves read by name back into the template's own tree structure."""

    def fill(template_tree: Any, named: Mapping[str, Any], prefix: str) -> Any:
        names = layout.leaf_names(template_tree)
        flat = flat_by_name(named, prefix)
        leaves = [flat[n] for n in names]
        return jax.tree.unflatten(jax.tree.structure(template_tree), leaves)

    tree = layout.state_tree(state)
    return TrainState(
        step=tree["extra"]["step"],
        params=fill(template.params, tree["params"], ""),
        opt_state=fill(template.opt_state, tree["opt_state"], ""),
        ema=fill(template.ema, tree["ema"], ""),
        rng=tree["extra"]["rng"],
        pending=None if template.pending is None else fill(template.pending, tree["pending"], ""),
    )


def flat_by_name(nested: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(nested, dict):
        return {prefix: nested}
    out: dict[str, Any] = {}
    for key, value in nested.items():
        out.update(flat_by_name(value, f"{prefix}.{key}" if prefix else key))
    return out


def covers(leaf: Mapping[str, Any]) -> bool:
    """Whether this process's regions cover the whole leaf (always so with one process)."""
    size = int(np.prod(leaf["shape"])) if leaf["shape"] else 1
    covered = np.zeros(leaf["shape"], bool) if leaf["shape"] else np.zeros((), bool)
    for region in leaf["regions"]:
        covered[slices(region)] = True
    return int(covered.sum()) == size


def slices(region: str) -> tuple[slice, ...]:
    if region == "scalar":
        return ()
    return tuple(slice(int(a), int(b)) for a, b in (part.split(":") for part in region.split(",")))


def assemble_host(leaf: Mapping[str, Any], by_region: Mapping[str, np.ndarray]) -> np.ndarray:
    out = np.empty(tuple(leaf["shape"]), np.dtype(leaf["dtype"]))
    for region, value in by_region.items():
        out[slices(region)] = value
    return out


def assemble_device(leaf: Mapping[str, Any], by_region: Mapping[str, np.ndarray], target: Any) -> jax.Array:
    sharding = getattr(target, "sharding", None) or layout.default_sharding()
    devices = {d.id: d for d in sharding.addressable_devices}
    arrays = []
    for device_id, region in leaf["devices"].items():
        value = by_region[layout.region_key(region)]
        arrays.append(jax.device_put(value, devices[int(device_id)]))
    return jax.make_array_from_single_device_arrays(tuple(leaf["shape"]), sharding, arrays)
