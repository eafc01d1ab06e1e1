"""Sampling-time discretisations of σ (EDM Table 1, "Sampling": σ(t) and the time steps t_i).

Each returns ``steps`` noise levels from the largest down to the smallest, without the final
σ = 0 of the paper: ``dew.sample`` ends on the model's clean prediction at the last point, which
is exactly what an Euler step from the last point to σ = 0 computes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _ramp(steps: int) -> Array:
    if steps < 2:
        raise ValueError(f"sigmas: steps must be >= 2 (T and the last point), got {steps}")
    return jnp.linspace(0.0, 1.0, steps)


def karras(steps: int, sigma_min: float, sigma_max: float, rho: float = 7.0) -> Array:
    """EDM Eq. 5: σ_i = (σ_max^{1/ρ} + i/(N−1) (σ_min^{1/ρ} − σ_max^{1/ρ}))^ρ."""
    ramp = _ramp(steps)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (hi + ramp * (lo - hi)) ** rho


def uniform(steps: int, sigma_min: float, sigma_max: float) -> Array:
    """Equal steps in σ (the naive baseline EDM's Fig. 3 compares against)."""
    return sigma_max + _ramp(steps) * (sigma_min - sigma_max)


def geometric(steps: int, sigma_min: float, sigma_max: float) -> Array:
    """VE (Song et al. 2021): σ_i = σ_max (σ_min/σ_max)^{i/(N−1)}, equal steps in ln σ."""
    return sigma_max * (sigma_min / sigma_max) ** _ramp(steps)


def vp_sigma(t: Array, beta_d: float = 19.9, beta_min: float = 0.1) -> Array:
    """VP's σ(t) = √(exp(½β_d t² + β_min t) − 1) (EDM Table 1)."""
    return jnp.sqrt(jnp.expm1(0.5 * beta_d * t**2 + beta_min * t))


def vp_time(sigma: Array, beta_d: float = 19.9, beta_min: float = 0.1) -> Array:
    """The inverse of ``vp_sigma``: t = (√(β_min² + 2β_d ln(σ²+1)) − β_min) / β_d."""
    return (jnp.sqrt(beta_min**2 + 2 * beta_d * jnp.log1p(sigma**2)) - beta_min) / beta_d


def vp(steps: int, eps_s: float = 1e-3, beta_d: float = 19.9, beta_min: float = 0.1) -> Array:
    """VP: t_i = 1 + i/(N−1) (ε_s − 1), σ_i = σ(t_i)."""
    t = 1.0 + _ramp(steps) * (eps_s - 1.0)
    return vp_sigma(t, beta_d, beta_min)


def flow(steps: int, sigma_min: float, sigma_max: float) -> Array:
    """Rectified flow: equal steps in t = σ/(1+σ) between the ends, σ = t/(1−t)."""
    t_hi, t_lo = sigma_max / (1 + sigma_max), sigma_min / (1 + sigma_min)
    t = t_hi + _ramp(steps) * (t_lo - t_hi)
    return t / (1 - t)
