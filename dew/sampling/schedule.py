"""The EDM/Karras σ schedule over any σ range, as a value known before tracing."""

from __future__ import annotations

import numpy as np


def karras_sigmas(
    steps: int, sigma_min: float, sigma_max: float, rho: float = 7.0, *, append_zero: bool = False
) -> np.ndarray:
    """EDM Eq. 5 (Karras et al. 2022): σ_i = (σ_max^{1/ρ} + i/(N−1) (σ_min^{1/ρ} − σ_max^{1/ρ}))^ρ
    for i = 0..N−1, from σ_max down to σ_min, as float32 (computed in float64).

    ``append_zero`` adds k-diffusion's trailing 0, which ``dew.sample`` reads as the clean
    prediction at σ_min (the same output as without it). The result is a NumPy array, so a
    ``sample`` that receives it inside ``jit`` still sees (and checks) its values.
    """
    if not (isinstance(steps, int | np.integer) and steps >= 2):
        raise ValueError(f"karras_sigmas: steps must be an int >= 2 (σ_max and σ_min), got {steps!r}")
    if not (np.isfinite(sigma_min) and np.isfinite(sigma_max) and 0 < sigma_min < sigma_max):
        raise ValueError(
            f"karras_sigmas: need 0 < sigma_min < sigma_max (finite), got sigma_min={sigma_min}, "
            f"sigma_max={sigma_max}"
        )
    if not (np.isfinite(rho) and rho > 0):
        raise ValueError(f"karras_sigmas: rho must be > 0, got {rho}")
    ramp = np.linspace(0.0, 1.0, int(steps))
    lo, hi = float(sigma_min) ** (1 / rho), float(sigma_max) ** (1 / rho)
    sigmas = (hi + ramp * (lo - hi)) ** rho
    if append_zero:
        sigmas = np.append(sigmas, 0.0)
    return sigmas.astype(np.float32)
