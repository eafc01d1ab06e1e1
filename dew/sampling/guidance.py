"""Classifier-free guidance limited to an interval of noise levels (Kynkäänniemi et al. 2024,
"Applying Guidance in a Limited Interval Improves Sample and Distribution Quality")."""

from __future__ import annotations

import dataclasses
import numbers

import jax

from dew.sampling.solvers import Denoiser


@dataclasses.dataclass(frozen=True)
class CFG:
    """Interval-limited classifier-free guidance.

    Inside σ ∈ (sigma_lo, sigma_hi]: D = D_u + w (D_c − D_u). Outside it the conditional
    prediction alone is used. The interval is in σ, not in step indices, so it means the same
    thing for any number of steps. ``weight == 1`` is no guidance. The fields may also be traced
    values, so one jitted sampler serves a sweep of weights or intervals; the range checks apply
    to Python numbers.
    """

    weight: float = 1.0
    sigma_lo: float = 0.0
    sigma_hi: float = float("inf")

    def __post_init__(self) -> None:
        if _concrete(self.weight) and self.weight < 0:
            raise ValueError(f"CFG.weight must be >= 0, got {self.weight}")
        if _concrete(self.sigma_lo, self.sigma_hi) and not self.sigma_lo < self.sigma_hi:
            raise ValueError(f"CFG: sigma_lo ({self.sigma_lo}) must be below sigma_hi ({self.sigma_hi})")

    def __call__(self, conditional: Denoiser, unconditional: Denoiser) -> Denoiser:
        if _concrete(self.weight) and self.weight == 1.0:
            return conditional

        def guided(x: jax.Array, sigma: jax.Array) -> jax.Array:
            d_c = conditional(x, sigma)
            inside = (sigma > self.sigma_lo) & (sigma <= self.sigma_hi)

            def guide() -> jax.Array:
                d_u = unconditional(x, sigma)
                return d_u + self.weight * (d_c - d_u)

            return jax.lax.cond(inside, guide, lambda: d_c)

        return guided


def _concrete(*values: object) -> bool:
    return all(isinstance(v, numbers.Real) for v in values)
