"""Where the data resumes, stored in a checkpoint: the data stream's position beside the share
that read it (the ``data`` item), and a caller's own dataset state (the ``dataset`` item).

A stream reports its position as JSON bytes, which tensorstore has no dtype for; the bytes ride
along as zero-padded uint8 rows, one per process, each with the ``DataPartition`` it was read
with, so a global position and a share's offset are stored the same way and told apart on
restore. A position without its share is refused, since no reader could be matched to it.

A caller's own pytree saved beside the state (the stix ``dataset_state``): ``restore_args`` says
what orbax is asked to read for it, and ``like_template`` gives the leaves back the types the
template's leaves have. Saved leaves are host values: Python numbers and strings as they are,
numpy and JAX arrays (0-d included) as numpy copies (``writer.host_copy``); orbax stores numbers
as scalars, strings as strings, arrays as arrays, with their dtypes. On restore the template (a
freshly initialised dataset state of the right structure) says what each leaf must come back as:

    str, int, float, bool   the Python value
    numpy scalar            a numpy scalar of the stored dtype (``np.int64(2)`` stays one)
    numpy array             a numpy array of the stored dtype (0-d stays 0-d)
    jax.Array / ShapeDtypeStruct   a ``jax.Array`` of the stored dtype, placed as the template's
                            leaf is (its sharding; without one, this process's first device)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from dew.checkpointing import layout
from dew.data.dataset import DataPartition

NO_SHARE = (
    "Checkpoints: a data position needs the share that read it (share=DataPartition(index, count)); "
    "no reader could be matched to a position without one"
)


def row(saved: bytes, share: DataPartition, width: int) -> dict[str, np.ndarray]:
    """This process's row: the position bytes zero-padded to ``width``, with its share.

    The length keeps trailing zero bytes of the JSON itself apart from the padding.
    """
    raw = np.frombuffer(bytes(saved), dtype=np.uint8)
    padded = np.zeros((1, width), np.uint8)
    padded[0, : raw.size] = raw
    return {
        "rows": padded,
        "lengths": np.array([raw.size], np.int32),
        "share_index": np.array([share.index], np.int32),
        "share_count": np.array([share.count], np.int32),
    }


def local_row(saved: bytes | None, share: DataPartition | None) -> dict[str, np.ndarray] | None:
    """This process's own row (for its local checkpoint), or None without a position."""
    if saved is None:
        return None
    if share is None:
        raise ValueError(NO_SHARE)
    return row(saved, share, len(saved))


def global_rows(saved: bytes | None, share: DataPartition | None) -> dict[str, Any] | None:
    """The ``data`` item of a persistent checkpoint: one row per process, as global arrays.

    A collective with several processes (every process must pass a position or none).
    """
    if saved is not None and share is None:
        raise ValueError(NO_SHARE)
    length = -1 if saved is None else len(saved)
    if jax.process_count() == 1:
        if saved is None:
            return None
        assert share is not None, "a position comes with its share (raised above otherwise)"
        return row(saved, share, length)
    lengths = np.asarray(multihost_utils.process_allgather(np.int64(length))).reshape(-1)
    if (lengths < 0).any() != (lengths < 0).all():
        raise ValueError(
            "Checkpoints.save: every process must pass a data position or none; "
            f"position lengths by process: {lengths.tolist()}"
        )
    if saved is None:
        return None
    assert share is not None, "a position comes with its share (raised above otherwise)"
    mine = row(saved, share, int(lengths.max()))
    count = jax.process_count()
    firsts = [
        min((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id) for p in range(count)
    ]
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(firsts), ("process",)), jax.P("process"))
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (count, *v.shape[1:])) for k, v in mine.items()
    }


def position_for(data: Mapping[str, Any], share: DataPartition, process_index: int) -> bytes:
    """The bytes the reader of ``share`` resumes from (``KeyError`` when none was stored).

    Rows are told apart by the share they were read with; when several processes read the same
    share (a global position), this process's own row is preferred, else the first match.
    """
    index, count = np.asarray(data["share_index"]), np.asarray(data["share_count"])
    matches = np.flatnonzero((index == share.index) & (count == share.count))
    if matches.size == 0:
        stored = [f"{i}/{c}" for i, c in zip(index.tolist(), count.tolist(), strict=True)]
        raise KeyError(f"no data position for share {share.index}/{share.count}; stored shares are {stored}")
    chosen = process_index if process_index in matches else int(matches[0])
    length = int(np.asarray(data["lengths"])[chosen])
    return bytes(np.asarray(data["rows"])[chosen, :length].tobytes())


# --- a caller's dataset state ----------------------------------------------------------------------
_ARRAYS = (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)


def restore_args(template: Any) -> Any:
    """Per-leaf ``RestoreArgs`` for ``template``: every array or numpy scalar is read as a numpy
    array (its stored dtype; placed afterwards by ``like_template``), strings and Python
    numbers as their own type."""

    def one(leaf: Any) -> ocp.RestoreArgs:
        if isinstance(leaf, _ARRAYS):
            return ocp.RestoreArgs(restore_type=np.ndarray)
        return ocp.RestoreArgs(restore_type=type(leaf))

    return jax.tree.map(one, template)


def like_template(restored: Any, template: Any) -> Any:
    """``restored`` (as ``restore_args`` reads it) with each leaf of the type of the template's."""

    def one(value: Any, leaf: Any) -> Any:
        if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
            host = np.asarray(value)
            sharding = getattr(leaf, "sharding", None) or layout.default_sharding()
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
        if isinstance(leaf, np.generic):
            return np.asarray(value)[()]
        if isinstance(leaf, np.ndarray):
            return np.asarray(value)
        return value

    return jax.tree.map(one, restored, template)
