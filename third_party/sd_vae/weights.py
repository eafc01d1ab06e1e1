"""Deterministic stand-in weights for the VAE parity test (NumPy only, no RNG library).

Both the reference script (PyTorch side) and the test (JAX side) compute every array of the
tiny ``AutoencoderKL`` from its state_dict name: an integer hash (splitmix64 finaliser, exact
uint64 arithmetic, identical on every machine) of the name and element index gives u in [0, 1),
mapped to

- kernels and Linear weights (ndim ≥ 2): uniform in ±√(3 / fan_in) (unit variance kept);
- GroupNorm weights (``norm`` in the name, ``.weight``): 1 + 0.2·(2u − 1);
- every bias: 0.1·(2u − 1).
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


def _unit(name: str, size: int) -> np.ndarray:
    seed = np.uint64(zlib.crc32(name.encode()))
    index = np.arange(size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = _splitmix(index + seed * np.uint64(0x100000001B3))
    return (bits >> np.uint64(11)).astype(np.float64) / float(2**53)  # [0, 1), exact


def parameter(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 array of state_dict entry ``name`` with PyTorch ``shape``."""
    u = _unit(name, int(np.prod(shape))).reshape(shape)
    if name.endswith(".bias"):
        a = 0.1 * (2 * u - 1)
    elif len(shape) >= 2:
        a = (2 * u - 1) * np.sqrt(3.0 / int(np.prod(shape[1:])))
    else:  # GroupNorm weight
        a = 1 + 0.2 * (2 * u - 1)
    return a.astype(np.float32)
