"""Deterministic stand-in weights for the Inception parity test (NumPy only, no RNG library).

The FID Inception has 21.8 M convolution weights, far too many to store as reference data, so
both the reference script (PyTorch side) and the test (JAX side) compute them from this formula:
an integer hash (splitmix64 finaliser, exact uint64 arithmetic, identical on every machine) of
the layer name and element index, mapped to uniform values in [−√(6/fan_in), √(6/fan_in)) (He's
scale for ReLU layers: activations keep their size through the 94 layers). The batch-norm
tensors are small and stored.
"""

from __future__ import annotations

import zlib

import numpy as np

_M1, _M2, _GOLDEN = (
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
    np.uint64(0x9E3779B97F4A7C15),
)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def conv_weight(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 OIHW kernel of convolution ``name`` (a PyTorch state_dict key)."""
    seed = np.uint64(zlib.crc32(name.encode()))
    index = np.arange(int(np.prod(shape)), dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = _splitmix(index + seed * np.uint64(0x100000001B3))
    unit = (bits >> np.uint64(11)).astype(np.float64) / float(2**53)  # [0, 1), exact
    fan_in = int(np.prod(shape[1:]))
    return ((2.0 * unit - 1.0) * np.sqrt(6.0 / fan_in)).astype(np.float32).reshape(shape)
