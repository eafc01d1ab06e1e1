"""A small state's checkpoint step written by dew itself, in the format orbax writes and reads.

Orbax's save of a step costs CPU per item whatever the item holds (its event loops and threads,
a tensorstore context per save, the OCDBT merge and its read-back validation): ~130-140 ms of
CPU for the five items of a tiny state, where writing the same files directly costs ~50 ms
(``benchmarks/checkpoint.py``, benchmarks/RESULTS.md). For a small model that fixed cost is
nearly all of a save, and on cores the training loop keeps busy, loop time. For a state of at
most ``SMALL_BYTES`` the store writes, here, the files orbax's ``PyTreeCheckpointHandler``
writes with ``use_ocdbt=False`` (its per-leaf zarr format, which every orbax reads), so orbax and
every dew restore path read the step as one of orbax's own:

    <step>/_CHECKPOINT_METADATA         orbax's step metadata: the item handlers, the save's
                                        timestamps, dew's custom part (``Store.write``)
    <step>/commit_success.txt
    <step>/<item>/_METADATA             orbax's tree metadata, built by orbax's own classes
    <step>/<item>/_sharding             each jax.Array leaf's sharding, orbax's serialization
    <step>/<item>/array_metadatas/process_0
    <step>/<item>/<leaf>/.zarray, 0.0   one zarr v2 array per leaf, zstd level 1, written by
                                        tensorstore from orbax's own spec (one chunk: leaves
                                        are small)
    <step>/<item>/commit_success.txt
    <step>/<item>/dew_checksums.json    the item's checksums (``integrity``), before the rename

All of it goes into ``<step>.orbax-checkpoint-tmp`` first and is renamed into place, as orbax
does: a kill leaves either a whole, checksummed step or an unfinished directory that the next
writer's orbax manager removes. Only a single-process run's states, whose leaves are arrays
this process holds whole (``eligible``; a sharded leaf is gathered and written as one chunk,
its sharding recorded); everything else is orbax's to write. The specs and metadata come from
orbax's own (internal) builders; tests/test_checkpoints_direct_write.py compares the files with
orbax's byte for byte, so an orbax whose format moves fails there, not in a user's restore.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from etils import epath
from orbax.checkpoint._src.metadata import array_metadata_store
from orbax.checkpoint._src.metadata import sharding as sharding_metadata
from orbax.checkpoint._src.metadata import tree as tree_metadata
from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
from orbax.checkpoint._src.serialization import type_handler_registry
from orbax.checkpoint._src.serialization.types import ParamInfo
from orbax.checkpoint._src.tree import utils as tree_utils

from dew.checkpointing.checksums import write_checksums

#: The largest state (all items, in bytes) written here. Measured (benchmarks/RESULTS.md): the
#: direct write cost less CPU than orbax's at 0.01, 1 and 4 MiB (4 MiB: 116 against 171 ms), the
#: same at 16 MiB (167 ms); a larger state goes to orbax (OCDBT), which writes each shard
#: where it lives (no copy of the whole state on the host) and chunks large leaves.
SMALL_BYTES = 16 * 2**20
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's: a writing manager removes what a kill left
STEP_METADATA = "_CHECKPOINT_METADATA"
COMMIT_SUCCESS = "commit_success.txt"
_SHARDING = "_sharding"
_TREE_METADATA = "_METADATA"


def eligible(items: Mapping[str, Any], limit: float | None = None) -> bool:
    """Whether this module writes ``items``: one process, every leaf an array of numbers this
    process holds whole (a ``jax.Array`` or a ``numpy`` array), ``limit`` bytes in all
    (default ``SMALL_BYTES``)."""
    if jax.process_count() != 1:
        return False
    total = 0
    for leaf in jax.tree.leaves(dict(items)):
        if isinstance(leaf, jax.Array):
            if not leaf.is_fully_addressable or jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                return False
        elif not isinstance(leaf, np.ndarray) or not (
            jnp.issubdtype(leaf.dtype, np.number) or leaf.dtype == np.bool_
        ):  # strings and objects are orbax's to write
            return False
        total += leaf.nbytes
    return total <= (SMALL_BYTES if limit is None else limit)


_CONTEXT: ts.Context | None = None


def _context() -> ts.Context:
    """One tensorstore context for every direct write of the process (its thread pools are made
    once; orbax makes one per save)."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = ts.Context({"file_io_concurrency": {"limit": 4}, "data_copy_concurrency": {"limit": 1}})
    return _CONTEXT


def write_step(
    directory: epath.Path,
    step: int,
    items: Mapping[str, Any],
    custom_metadata: Mapping[str, Any],
    handler_typestr: str,
) -> None:
    """Write ``items`` (name -> pytree of arrays, ``eligible``) as checkpoint step ``step`` of
    ``directory``; landed (renamed into place) on return. ``handler_typestr`` is the item
    handler orbax records for each item (the one the store registers for reading)."""
    started = time.time_ns()
    final = directory / str(step)
    tmp = directory / f"{step}{TMP_SUFFIX}"
    if tmp.exists():  # a write of this step that was cut short
        tmp.rmtree()
    tmp.mkdir(parents=True)
    leaves = {
        name: jax.tree_util.tree_flatten_with_path(tree, is_leaf=tree_utils.is_empty_or_leaf)[0]
        for name, tree in items.items()
    }
    arrays = [
        leaf for flat in leaves.values() for _, leaf in flat if isinstance(leaf, jax.Array | np.ndarray)
    ]
    host = iter(jax.device_get(arrays))  # one transfer for all
    opened = []
    for name, tree in items.items():
        values = [
            np.asarray(next(host)) if isinstance(leaf, jax.Array | np.ndarray) else None
            for _, leaf in leaves[name]
        ]
        opened += _write_item(tmp / name, final / name, tree, leaves[name], values)
    writes = [store.result().write(value) for store, value in opened]
    for write in writes:
        write.result()
    for name in items:
        write_checksums(tmp / name)
        (tmp / name / COMMIT_SUCCESS).write_text(f"Checkpoint commit was successful to {final / name}")
    step_metadata = {
        "item_handlers": {name: handler_typestr for name in sorted(items)},
        "metrics": {},
        "performance_metrics": {},
        "init_timestamp_nsecs": started,
        "commit_timestamp_nsecs": time.time_ns(),
        "custom_metadata": dict(custom_metadata),
    }
    (tmp / STEP_METADATA).write_text(json.dumps(step_metadata))
    (tmp / COMMIT_SUCCESS).write_text(f"Checkpoint commit was successful to {final}")
    tmp.rename(final)


def _write_item(
    item_dir: epath.Path, final: epath.Path, tree: Any, flat: list[tuple[Any, Any]], values: list[Any]
) -> list[tuple[Any, np.ndarray]]:
    """Write one item's metadata files as orbax's pytree handler does with ``use_ocdbt=False``,
    and start opening its arrays: returns (tensorstore's open future, the value) per array."""
    item_dir.mkdir()
    options = tree_metadata.PYTREE_METADATA_OPTIONS
    registry = type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY
    infos, shardings, array_metadatas, opened = [], {}, [], []
    for (keypath, leaf), value in zip(flat, values, strict=True):
        name = tree_utils.param_name_from_keypath(keypath)
        typestr = type_handler_registry.get_param_typestr(leaf, registry, options)
        is_jax = isinstance(leaf, jax.Array)
        infos.append(
            ParamInfo(
                name=name,
                keypath=keypath,
                parent_dir=final,
                value_typestr=typestr,
                write_shape=tuple(value.shape) if is_jax else None,
                use_compression=True,
                use_zarr3=False,
                is_ocdbt_checkpoint=False,
                ts_context=_context(),
            )
        )
        if value is None:  # an empty node (None, {}, an optimizer's EmptyState): metadata only
            continue
        spec = ts_utils.ArrayWriteSpec(
            item_dir.as_posix(),
            name,
            global_shape=tuple(value.shape),
            write_shape=tuple(value.shape),
            dtype=value.dtype,
            use_ocdbt=False,
            use_compression=True,
            use_zarr3=False,
        )
        if is_jax:
            array_metadatas.append(spec.metadata)
            serialized = sharding_metadata.from_jax_sharding(leaf.sharding)
            if serialized is not None:
                key = base64.urlsafe_b64encode(name.encode()).decode("utf-8")
                shardings[key] = serialized.to_serialized_string()
        opened.append((ts.open(spec.json, create=True, open=True, context=_context()), value))
    info_tree = jax.tree.unflatten(jax.tree.structure(tree, is_leaf=tree_utils.is_empty_or_leaf), infos)
    metadata = tree_metadata.InternalTreeMetadata.build(
        info_tree, use_ocdbt=False, use_zarr3=False, pytree_metadata_options=options
    )
    (item_dir / _TREE_METADATA).write_text(json.dumps(metadata.to_json()))
    if shardings:
        (item_dir / _SHARDING).write_text(json.dumps(shardings, separators=(",", ":"), sort_keys=True))
    if array_metadatas:
        (item_dir / "array_metadatas").mkdir()
        serialized_metadatas = array_metadata_store.Serializer().serialize(array_metadatas)
        (item_dir / "array_metadatas" / "process_0").write_text(serialized_metadatas)
    return opened
