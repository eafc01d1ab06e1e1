"""A run of same-shaped blocks, unrolled or as one ``lax.scan`` over their stacked parameters.

A transformer's blocks are one program repeated: unrolled, XLA compiles each copy (on a TPU v5e
a SiT-B/2 training step took 38.5 s to compile at depth 12 against 11.6 s at depth 2: ~2.7 s a
block); scanned, it compiles one. ``run_blocks`` gives both forms the same parameters, under the
same names (``blocks_0``, ``blocks_1``, …, as the references' state dicts and every converter and
checkpoint name them):

* at init, and with ``scan=False``, the blocks run one after another (the same initial values
  either way: the same modules draw the same keys in the same order);
* applied with ``scan=True``, the blocks' parameters are read from the enclosing module
  (``hk.experimental.transparent_lift``), stacked along a new leading axis and run by
  ``jax.lax.scan`` through the first block's module: the same function, compiled once.

The scan's price is memory: XLA keeps every iteration's residuals for the backward pass where
the unrolled program may recompute cheap ones, so pair it with ``remat`` (measured figures:
``dew.networks.dit``'s docstring). XLA's cost analysis counts a scan's body once: FLOPs of a
scanned program are not the step's.

``remat`` (``REMAT_POLICIES``) recomputes each block's activations in the backward pass in both
forms (``hk.remat`` unrolled, ``jax.checkpoint`` around the scan's body).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
from haiku.experimental import transparent_lift

from dew.networks.remat import REMAT_POLICIES

_NOTHING = hk.transform(lambda: None)


def _own(params: Mapping[str, Any], name: str, as_name: str) -> dict[str, Any]:
    """The entries of module ``name`` (relative to the enclosing module), renamed to ``as_name``."""
    return {
        as_name + key[len(name) :]: value
        for key, value in params.items()
        if key == name or key.startswith(name + "/")
    }


def run_blocks(
    make_block: Callable[[str], Callable[..., jax.Array]],
    names: Sequence[str],
    x: jax.Array,
    *args: Any,
    remat: str = "none",
    scan: bool = False,
) -> jax.Array:
    """``block_n(… block_1(x, *args) …, *args)`` for the blocks ``make_block(name)`` builds, one per
    name in ``names`` (each an ``hk.Module`` of the same structure, taking no random key); called
    inside the enclosing module's ``__call__``. ``args`` are the same for every block."""
    policy = REMAT_POLICIES[remat]
    if not names:
        return x
    if not scan or len(names) == 1 or hk.running_init():
        for name in names:
            block = make_block(name)
            if remat == "none":
                x = block(x, *args)
            else:
                x = hk.remat(lambda x_, *a, b=block: b(x_, *a), policy=policy)(x, *args)
        return x
    everything = transparent_lift(_NOTHING.init)(None)
    first = names[0]
    per_block = [_own(everything, name, first) for name in names]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *per_block)
    apply_first = hk.transform(lambda x_, *a: make_block(first)(x_, *a)).apply

    def body(carry: jax.Array, params: Any) -> tuple[jax.Array, None]:
        return apply_first(params, None, carry, *args), None

    if remat != "none":
        body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    x, _ = jax.lax.scan(body, x, stacked)
    return x


__all__ = ["run_blocks"]
