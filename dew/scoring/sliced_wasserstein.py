"""Sliced Wasserstein distance between two sample sets (Rabin et al. 2011; Bonneel et al. 2015).

SW₂(P, Q)² = E_θ [ W₂(θ·P, θ·Q)² ] over directions θ uniform on the sphere; each 1-D W₂ between
equal-size empirical sets is the RMS difference of the sorted projections. Two independent
samples of the *same* distribution are not at distance 0: that value (the noise floor) is the
best any generator can score at that sample size, so results are read as a ratio to it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dew import registry


def sliced_wasserstein(a: np.ndarray, b: np.ndarray, projections: int = 512, seed: int = 0) -> float:
    """SW₂ between point sets ``a`` and ``b`` [N, D] (equal N), over ``projections`` fixed directions."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(
            f"sliced_wasserstein: need two [N, D] sets of equal shape, got {a.shape} and {b.shape}"
        )
    theta = np.random.default_rng(seed).standard_normal((a.shape[1], projections))
    theta /= np.linalg.norm(theta, axis=0, keepdims=True)
    pa, pb = np.sort(a @ theta, axis=0), np.sort(b @ theta, axis=0)
    return float(np.sqrt(np.mean((pa - pb) ** 2)))


registry.metrics.register("sliced_wasserstein", sliced_wasserstein)


def ratio_to_noise_floor(
    draw: Callable[[int], np.ndarray],
    draw_real: Callable[[int], np.ndarray],
    *,
    sets: int = 5,
    floor_pairs: int = 20,
) -> tuple[float, float, float]:
    """(mean SW₂(model, real), mean SW₂(real, real), their ratio).

    ``draw(k)`` returns the model's k-th sample set and ``draw_real(k)`` an independent exact set
    of the same size for every k (each call a fresh one). Set k of the model is compared with real
    set k; the floor averages ``floor_pairs`` pairs of real sets (it is cheap, and a stable floor
    keeps the ratio from being decided by the floor's own noise).
    """
    model = [sliced_wasserstein(draw(k), draw_real(k), seed=k) for k in range(sets)]
    floor = [
        sliced_wasserstein(draw_real(10_000 + 2 * k), draw_real(10_001 + 2 * k), seed=k)
        for k in range(floor_pairs)
    ]
    return float(np.mean(model)), float(np.mean(floor)), float(np.mean(model) / np.mean(floor))
