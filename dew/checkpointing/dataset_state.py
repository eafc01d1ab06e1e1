"""A caller's own pytree saved beside the state (the stix ``dataset_state``): what orbax is asked
to read for it, and the leaves given back the types the template's leaves have.

Saved leaves are host values: Python numbers and strings as they are, numpy and JAX arrays (0-d
included) as numpy copies (``writer.host_copy``); orbax stores numbers as scalars, strings as
strings, arrays as arrays, with their dtypes. On restore the template (a freshly initialised
dataset state of the right structure) says what each leaf must come back as:

    str, int, float, bool   the Python value
    numpy scalar            a numpy scalar of the stored dtype (``np.int64(2)`` stays one)
    numpy array             a numpy array of the stored dtype (0-d stays 0-d)
    jax.Array / ShapeDtypeStruct   a ``jax.Array`` of the stored dtype, placed as the template's
                            leaf is (its sharding; without one, this process's first device)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from dew.checkpointing import layout

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
