"""A 2D Gaussian mixture: a toy data set whose exact denoiser is known in closed form.

For data y ~ Σ_k π_k N(μ_k, s_k² I) and x = y + σ n, the noisy marginal is Σ_k π_k N(μ_k,
(s_k² + σ²) I) and the minimum-MSE denoiser (the one a perfect EDM network learns) is

    D(x; σ) = Σ_k w_k(x, σ) (s_k² x + σ² μ_k) / (s_k² + σ²),
    w_k ∝ π_k N(x; μ_k, (s_k² + σ²) I),

the posterior-weighted mean of each component's Gaussian posterior. Samplers are compared on it
against another implementation, and against each other, with no training noise in the way.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.data.dataset import Source


@dataclasses.dataclass(frozen=True)
class GaussianMixture:
    """Isotropic components: ``means`` [K, D], ``stds`` [K], ``weights`` [K] summing to 1."""

    means: tuple[tuple[float, ...], ...]
    stds: tuple[float, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        k = len(self.means)
        if not (k == len(self.stds) == len(self.weights)) or k == 0:
            raise ValueError(
                f"GaussianMixture: means, stds and weights need the same non-zero length, got "
                f"{k}, {len(self.stds)}, {len(self.weights)}"
            )
        if any(s <= 0 for s in self.stds) or any(w <= 0 for w in self.weights):
            raise ValueError("GaussianMixture: stds and weights must be > 0")
        if not math.isclose(sum(self.weights), 1.0, rel_tol=1e-6):
            raise ValueError(f"GaussianMixture: weights must sum to 1, got {sum(self.weights)}")

    @property
    def dim(self) -> int:
        return len(self.means[0])

    def sample(self, n: int, seed: int) -> np.ndarray:
        """``n`` exact draws, [n, D] float32, reproducible from ``seed``."""
        rng = np.random.default_rng(seed)
        component = rng.choice(len(self.weights), size=n, p=np.asarray(self.weights))
        means, stds = np.asarray(self.means), np.asarray(self.stds)
        return (means[component] + stds[component, None] * rng.standard_normal((n, self.dim))).astype(
            np.float32
        )

    def denoise(self, x: jax.Array, sigma: jax.Array) -> jax.Array:
        """The exact D(x; σ) for x [B, D] and σ scalar or [B]; pure and jittable.

        Written with two [B, K] x [K, D] products and no [B, K, D] temporary:
        ‖x − μ_k‖² = ‖x‖² − 2 x·μ_k + ‖μ_k‖², and the posterior mean splits into
        x Σ_k w_k s_k²/(s_k² + σ²) + σ² Σ_k (w_k/(s_k² + σ²)) μ_k.
        """
        dtype = x.dtype
        means = jnp.asarray(self.means, dtype)  # [K, D]
        var = jnp.asarray(self.stds, dtype) ** 2  # [K]
        sigma = jnp.asarray(sigma, dtype)
        s2 = (sigma**2).reshape(-1, 1) if sigma.ndim else sigma**2  # [B, 1] or []
        total = var[None, :] + s2  # [B or 1, K]
        sq = jnp.sum(x**2, -1, keepdims=True) - 2 * x @ means.T + jnp.sum(means**2, -1)[None]
        logits = (
            jnp.log(jnp.asarray(self.weights, dtype)) - 0.5 * self.dim * jnp.log(total) - 0.5 * sq / total
        )
        w = jax.nn.softmax(logits, axis=-1) / total  # [B, K]
        return x * jnp.sum(w * var[None, :], -1, keepdims=True) + s2 * (w @ means)


def ring(modes: int = 8, radius: float = 1.0, std: float = 0.15) -> GaussianMixture:
    """``modes`` equal components evenly spaced on a circle (the classic 2D toy)."""
    angles = [2 * math.pi * i / modes for i in range(modes)]
    return GaussianMixture(
        means=tuple((radius * math.cos(a), radius * math.sin(a)) for a in angles),
        stds=(std,) * modes,
        weights=(1.0 / modes,) * modes,
    )


RING = ring()
"""The default toy: 8 components of std 0.15 on the unit circle."""

_SIZES = {"train": 20_000, "validation": 2_000}


def gaussian_mixture(split: str = "train") -> Source:
    """Fixed draws from ``RING``: field ``x`` [N, 2]; train (20,000) and validation (2,000)."""
    if split not in _SIZES:
        raise ValueError(f"gaussian_mixture: split must be one of {sorted(_SIZES)}, got {split!r}")
    seed = 0 if split == "train" else 1
    return Source(
        name=f"gaussian_mixture/{split}", fields={"x": RING.sample(_SIZES[split], seed)}, sample_field="x"
    )


registry.datasets.register("gaussian_mixture", gaussian_mixture)
