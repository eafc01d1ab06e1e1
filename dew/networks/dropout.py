"""Dropout whose mask is ``hk.dropout``'s, bit for bit, drawn by one fused kernel on every backend.

``hk.dropout`` draws its mask with ``jax.random.bernoulli``: Threefry-2x32 hashes of the
element indices (JAX's partitionable counter scheme). On XLA:CPU JAX lowers that hash to a
rolled ``while`` loop of five four-round blocks, so each dropout site is a loop of small
kernels, kept apart from the code around it. ``threefry_bits`` writes the same 20 rounds
(Salmon et al. 2011, Threefry-2x32: rotations R = (13, 15, 26, 6 | 17, 29, 16, 24), key schedule
k2 = k0 ^ k1 ^ 0x1BD11BDA, a key injection and the block number after every four rounds) as
plain elementwise integer operations, which XLA fuses with the iota that feeds them and with the
comparison and scaling that follow: one kernel per dropout site, and a program that shards like
any elementwise one. The bits, and so the masks, are those of ``jax.random.bits`` /
``jax.random.bernoulli`` under ``jax_threefry_partitionable`` (tested bit for bit).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: jax.Array, bits: int) -> jax.Array:
    return lax.shift_left(x, np.uint32(bits)) | lax.shift_right_logical(x, np.uint32(32 - bits))


def threefry2x32(key: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds) of the counter pairs (x0, x1) under ``key`` (uint32[2])."""
    ks = (key[0], key[1], key[0] ^ key[1] ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for block in range(5):
        for rotation in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, rotation) ^ x0
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
    """uint32 row-major element index of ``shape``, as a sum of per-axis iotas (which XLA's SPMD
    partitioner splits like the array they index)."""
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride)
        stride *= shape[axis]
    return index


def threefry_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``jax.random.bits(key, shape)`` (uint32, partitionable Threefry) as fusable operations.
    ``key`` is a raw uint32[2] key or a typed threefry key."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    if math.prod(shape) >= 2**32:
        raise ValueError(f"threefry_bits: {math.prod(shape)} elements; at most 2**32 - 1 are supported")
    high, low = threefry2x32(key, jnp.zeros(shape, jnp.uint32), _flat_index(shape))
    return high ^ low


def dropout(rng: jax.Array, rate: float, x: jax.Array) -> jax.Array:
    """``hk.dropout(rng, rate, x)``: zero each element with probability ``rate``, scale the rest
    by 1 / (1 - rate); the same mask and values as haiku's for the same key."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout: rate must be in [0, 1), got {rate}")
    if rate == 0.0:
        return x
    keep_rate = 1.0 - rate
    # jax.random.uniform's float32 from 32 bits: 23 mantissa bits under the exponent of 1.0.
    mantissa = lax.shift_right_logical(threefry_bits(rng, x.shape), np.uint32(9))
    uniform = lax.bitcast_convert_type(mantissa | np.uint32(0x3F800000), jnp.float32) - 1.0
    keep = uniform < jnp.float32(keep_rate)
    return keep * x / keep_rate
