"""What the objectives and the trainer share of the precision policy: the compute dtype a run
config names (``compute_dtype_of``) and a network called in it (``compute_in``, over
``cast_floats``). The policy itself (``config.precision``, the loss scale) is the trainer's,
``dew.training.precision``, which re-exports these; an objective reads them here, so no modality
imports the trainer core (``docs/precision.md`` states which operations stay float32).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def cast_floats(tree: Any, dtype: jnp.dtype) -> Any:
    """Every floating leaf of ``tree`` as ``dtype`` (integer leaves untouched). A float32 leaf
    asked for float32 is returned as it is (no operation), so the float32 policy adds nothing."""

    def cast(x: Any) -> Any:
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


def compute_in(apply: Callable[..., Any], dtype: Any) -> Callable[..., Any]:
    """A transformed network's ``apply(params, rng, x, *rest, **options)`` under the precision
    policy: with ``dtype`` float32 ``apply`` itself (the step is unchanged, bit for bit);
    otherwise the network computes in ``dtype`` on the float32 parameters cast at use, with its
    input ``x`` cast when it is floating (token ids stay integers), and every floating leaf of
    its result returns to float32, so the loss, its targets and the sampler's arithmetic stay
    float32. ``rest`` (times, labels, guidance
    settings) is passed as given: a network embeds its times in float32 and casts the
    embedding (e.g. ``dew.networks.dit_layers.TimestepEmbedder``), so t = 999 stays exact. Under
    ``jax.jvp`` the tangent follows the same casts: the JVP runs in ``dtype`` (MeanFlow's)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float32:
        return apply

    def mixed(params: Any, rng: Any, x: jax.Array, *rest: Any, **options: Any) -> Any:
        out = apply(cast_floats(params, dtype), rng, cast_floats(x, dtype), *rest, **options)
        return cast_floats(out, jnp.dtype(jnp.float32))

    return mixed


def compute_dtype_of(config: Any) -> str:
    """``config.precision.compute`` of a run config ("float32" when it has no precision section)."""
    return str(config.precision.compute) if "precision" in config else "float32"


__all__ = ["cast_floats", "compute_dtype_of", "compute_in"]
