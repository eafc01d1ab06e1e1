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

import datetime
import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath

from dew.checkpointing import layout, positions, step_files
from dew.checkpointing.errors import CheckpointDamagedError, CheckpointRestorationError, first_line
from dew.contracts.state import TrainState
from dew.data.dataset import DataPartition

META = "placement.json"
FORMAT = "dew-local-checkpoint/2"  # leaves named by checkpoint item (params.w, ema_params.w, ...)
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
    step_files.write_checksums(epath.Path(tmp))  # inside the step before it lands: all or nothing
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
        if name != str(step) and not name.startswith("damaged-"):  # damaged steps are kept aside
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return final


def latest_step(root: str) -> int | None:
    """The step that has landed under ``root`` (temporary directories never count)."""
    if not os.path.isdir(root):
        return None
    steps = [int(n) for n in os.listdir(root) if n.isdigit() and os.path.isfile(os.path.join(root, n, META))]
    return max(steps) if steps else None


def read_meta(root: str, step: int) -> dict[str, Any]:
    """The step's placement file, checked to be one this module wrote for ``step``."""
    try:
        with open(os.path.join(root, str(step), META)) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointDamagedError(
            f"local checkpoint step {step} in {root} is damaged: {first_line(e)}", step=step, item="local"
        ) from e
    if isinstance(meta, dict) and meta.get("format") != FORMAT:
        raise CheckpointRestorationError(
            f"local checkpoint step {step} in {root} has format {meta.get('format')!r}, this dew reads "
            f"{FORMAT!r}: delete {os.path.join(root, str(step))} (the persistent checkpoints are unaffected)"
        )
    if not isinstance(meta, dict) or meta.get("step") != step or "placement" not in meta:
        raise CheckpointDamagedError(
            f"local checkpoint step {step} in {root} is damaged: its placement file records "
            f"{str(meta)[:200]}",
            step=step,
            item="local",
        )
    return meta


def describe(step: int, state: TrainState) -> tuple[list[list[np.ndarray]], dict[str, Any]]:
    """This process's distinct shards of every leaf (copied to the host) and the placement file.

    Runs on the writer thread: the device-to-host copies happen off the loop.
    """
    shards, placement = [], []
    for name, leaf in layout.leaf_names(layout.items_from_state(state)).items():
        array = (
            leaf if isinstance(leaf, jax.Array) else jax.device_put(np.asarray(leaf), jax.local_devices()[0])
        )
        unique = unique_local_shards(array)
        described = leaf_placement(array.shape, array.sharding)
        described.update(name=name, dtype=str(np.dtype(array.dtype)), regions=list(unique))
        placement.append(described)
        shards.append([np.asarray(shard) for shard in unique.values()])
    meta = {
        "format": FORMAT,
        "step": step,
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "placement": placement,
        # Each item's tree as the persistent tier's metadata gives it (``stored``).
        "trees": layout.skeleton(layout.items_from_state(state)),
    }
    rng_impl = layout.key_impl(state.rng)
    if rng_impl is not None:  # a typed key: its data is stored (layout.typed_rng)
        meta["rng_impl"] = rng_impl
    return shards, meta


def placement_problem(meta: Mapping[str, Any], template: TrainState | None) -> str | None:
    """Why this process cannot reassemble the step onto ``template``, or None.

    Decided from the placement file alone, before any shard is read.
    """
    if (meta["process_index"], meta["process_count"]) != (jax.process_index(), jax.process_count()):
        return (
            f"written by process {meta['process_index']} of {meta['process_count']}, "
            f"this is process {jax.process_index()} of {jax.process_count()}"
        )
    stored = {leaf["name"]: leaf for leaf in meta["placement"]}
    if template is None:
        uncovered = [name for name, leaf in stored.items() if not covers(leaf)]
        return None if not uncovered else f"this process holds only part of {uncovered[:3]}; pass a template"
    wanted = layout.leaf_names(layout.items_from_state(template))
    if set(wanted) != set(stored):
        return f"the template's leaves differ from the stored ones: {sorted(set(wanted) ^ set(stored))[:5]}"
    for name, leaf in wanted.items():
        here = leaf_placement(leaf.shape, getattr(leaf, "sharding", None) or layout.default_sharding())
        if here["shape"] != stored[name]["shape"] or here["devices"] != stored[name]["devices"]:
            return (
                f"leaf {name!r} was written as {stored[name]['devices']} (device id: region) of shape "
                f"{stored[name]['shape']}, the template places it as {here['devices']} "
                f"of shape {here['shape']}"
            )
    return None


def restore(
    root: str, step: int, meta: Mapping[str, Any], template: TrainState | None, share: DataPartition | None
) -> tuple[TrainState, bytes | None]:
    """Reassemble the state (onto ``template``'s placement, or as host arrays) and the position
    of ``share``. Call only after ``placement_problem`` returned None. The files are checked
    against their checksums first (``verify``)."""
    verify(root, step)
    try:
        shards = read_shards(root, step, meta)
        data = read_data(root, step)
    except (OSError, ValueError, EOFError) as e:
        raise CheckpointDamagedError(
            f"local checkpoint step {step} in {root} is damaged ({type(e).__name__}: {first_line(e)})",
            step=step,
            item="local",
        ) from e
    values = {}
    wanted = layout.leaf_names(layout.items_from_state(template)) if template is not None else {}
    for leaf, leaf_shards in zip(meta["placement"], shards, strict=True):
        by_region = dict(zip(leaf["regions"], leaf_shards, strict=True))
        if template is None:
            values[leaf["name"]] = assemble_host(leaf, by_region)
        else:
            values[leaf["name"]] = assemble_device(leaf, by_region, wanted[leaf["name"]])
    state = layout.state_from_items(items_from_names(values, template))
    count = int(np.asarray(state.step))
    if count != step:
        raise CheckpointDamagedError(
            f"local checkpoint step {step} in {root} is damaged: the restored state is at step {count}",
            step=step,
            item="local",
        )
    position = None
    if share is not None and data is not None:
        try:
            position = positions.position_for(data, share, 0)
        except KeyError as e:
            raise CheckpointRestorationError(f"local checkpoint step {step}: {e.args[0]}") from None
    return state, position


def verify(root: str, step: int) -> None:
    """Check ``step``'s files against the checksums written with them (steps written before
    checksums were pass); raise ``CheckpointDamagedError`` naming the file."""
    directory = epath.Path(root) / str(step)
    if (directory / step_files.CHECKSUMS).exists():
        step_files.verify_item(step, "local", directory)


def set_aside(root: str, step: int) -> str:
    """Rename a damaged local step to ``damaged-<step>-<time>`` (out of the step namespace,
    never deleted); return its new path."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    target = os.path.join(root, f"damaged-{step}-{stamp}")
    os.rename(os.path.join(root, str(step)), target)
    return target


def stored(meta: Mapping[str, Any]) -> TrainState:
    """Shapes and dtypes by field, each a ``jax.ShapeDtypeStruct`` tree of the shape the
    persistent tier's ``stored`` gives (lists for sequences, dicts for mappings and named
    nodes), an item without leaves None; no shard is read. A step written before the trees
    were recorded comes back as nested dicts split at the dots of the leaf names."""
    leaves = {
        leaf["name"]: jax.ShapeDtypeStruct(tuple(leaf["shape"]), np.dtype(leaf["dtype"]))
        for leaf in meta["placement"]
    }
    if "trees" in meta:
        return layout.state_from_items(layout.fill_skeleton(meta["trees"], leaves))
    return layout.state_from_items(items_from_names(leaves, None))


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
def items_from_names(values: Mapping[str, Any], template: TrainState | None) -> dict[str, Any]:
    """Checkpoint items from leaves read by dotted name: in the template's own tree structure,
    or (without a template) as nested dicts."""
    if template is not None:
        items = {}
        for item, tree in layout.items_from_state(template).items():
            names = layout.leaf_names(tree)
            leaves = [values[f"{item}.{name}"] for name in names]
            items[item] = jax.tree.unflatten(jax.tree.structure(tree), leaves)
        return items
    nested: dict[str, Any] = {}
    for name, value in values.items():
        parts = name.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


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
        value = by_region[region_key(region)]
        arrays.append(jax.device_put(value, devices[int(device_id)]))
    return jax.make_array_from_single_device_arrays(tuple(leaf["shape"]), sharding, arrays)


# --- what this process's devices hold ------------------------------------------------------------
def _index_key(index: tuple[slice, ...], shape: Sequence[int]) -> list[list[int]]:
    return [[*s.indices(n)[:2]] for s, n in zip(index, shape, strict=True)]


def leaf_placement(shape: Sequence[int], sharding: jax.sharding.Sharding) -> dict[str, Any]:
    """Which part of a ``shape`` array each of this process's devices holds, as JSON."""
    devices = sharding.addressable_devices_indices_map(tuple(shape))
    placed = {}
    for d, idx in sorted(devices.items(), key=lambda kv: kv[0].id):
        assert idx is not None, f"device {d.id} holds no index of the {tuple(shape)} array"
        placed[str(d.id)] = _index_key(idx, shape)
    return {"shape": list(shape), "devices": placed}


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


def remove(root: str) -> None:
    """Delete this process's local checkpoints (every step under ``root``)."""
    if os.path.isdir(root):
        shutil.rmtree(root)
