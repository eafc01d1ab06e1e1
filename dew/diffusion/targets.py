"""What a network can be trained to predict, and the closed-form maps between the targets.

Everything is written in the σ-parameterisation of Karras et al. 2022 (EDM, Eq. 1 with s = 1):
a noisy sample is x = y + σ n with clean data y and standard normal noise n. Other forms are
rescalings of it:

* variance preserving (VP, DDPM):  x_vp = α x,  α = 1/√(1+σ²),  σ_vp = σ α;
* rectified flow / flow matching:  x_t = (1−t) y + t n = x / (1+σ),  t = σ/(1+σ).

Each target is an affine function of (y, n) for fixed x and σ, so the denoised estimate
D(x; σ) = c_skip(σ) x + c_out(σ) F follows from a prediction F of the target in closed form
(EDM Eq. 7). The targets:

* ``x0``:   F = y                                    c_skip = 0,          c_out = 1
* ``eps``:  F = n                                    c_skip = 1,          c_out = −σ
* ``v``:    F = α n − σ_vp y (Salimans & Ho 2022)    c_skip = 1/(1+σ²),   c_out = −σ/√(1+σ²)
* ``flow``: F = n − y (the flow velocity dx_t/dt)    c_skip = 1/(1+σ),    c_out = −σ/(1+σ)
* ``edm``:  F = (y − c_skip x)/c_out with σ_data     c_skip = σ_d²/(σ²+σ_d²), c_out = σσ_d/√(σ²+σ_d²)

(``edm`` with σ_data = 1 is −v: EDM's preconditioning is v-prediction with a data scale.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _edm_skip(sigma: Array, sigma_data: float) -> Array:
    return sigma_data**2 / (sigma**2 + sigma_data**2)


def _edm_out(sigma: Array, sigma_data: float) -> Array:
    return sigma * sigma_data / jnp.sqrt(sigma**2 + sigma_data**2)


#: Each target's (c_skip, c_out) as functions of (σ, σ_data): the table in the module docstring.
SCALES = {
    "x0": (lambda s, d: jnp.zeros_like(s), lambda s, d: jnp.ones_like(s)),
    "eps": (lambda s, d: jnp.ones_like(s), lambda s, d: -s),
    "v": (lambda s, d: 1.0 / (1.0 + s**2), lambda s, d: -s / jnp.sqrt(1.0 + s**2)),
    "flow": (lambda s, d: 1.0 / (1.0 + s), lambda s, d: -s / (1.0 + s)),
    "edm": (_edm_skip, _edm_out),
}

TARGETS = tuple(SCALES)


def _check(target: str) -> None:
    if target not in SCALES:
        raise ValueError(f"prediction target {target!r} is unknown: expected one of {TARGETS}")


def c_skip(target: str, sigma: Array, sigma_data: float = 0.5) -> Array:
    """The skip scale of D = c_skip x + c_out F for ``target``."""
    _check(target)
    return SCALES[target][0](jnp.asarray(sigma), sigma_data)


def c_out(target: str, sigma: Array, sigma_data: float = 0.5) -> Array:
    """The output scale of D = c_skip x + c_out F for ``target``."""
    _check(target)
    return SCALES[target][1](jnp.asarray(sigma), sigma_data)


def _per_example(sigma: Array, x: Array) -> Array:
    sigma = jnp.asarray(sigma, x.dtype)
    return sigma.reshape(sigma.shape + (1,) * (x.ndim - sigma.ndim)) if sigma.ndim else sigma


def to_denoised(target: str, prediction: Array, x: Array, sigma: Array, sigma_data: float = 0.5) -> Array:
    """D(x; σ) from a prediction of ``target`` (σ scalar or per example [B])."""
    s = _per_example(sigma, x)
    return c_skip(target, s, sigma_data) * x + c_out(target, s, sigma_data) * prediction


def from_denoised(target: str, denoised: Array, x: Array, sigma: Array, sigma_data: float = 0.5) -> Array:
    """The prediction of ``target`` that a denoised estimate D(x; σ) implies (σ > 0 unless x0)."""
    s = _per_example(sigma, x)
    return (denoised - c_skip(target, s, sigma_data) * x) / c_out(target, s, sigma_data)


def convert(
    prediction: Array, source: str, target: str, x: Array, sigma: Array, sigma_data: float = 0.5
) -> Array:
    """Re-express a prediction of ``source`` as a prediction of ``target`` at the same (x, σ)."""
    return from_denoised(target, to_denoised(source, prediction, x, sigma, sigma_data), x, sigma, sigma_data)


def _v_truth(y: Array, n: Array, s: Array, sigma_data: float) -> Array:
    alpha = 1.0 / jnp.sqrt(1.0 + s**2)
    return alpha * n - (s * alpha) * y


def _edm_truth(y: Array, n: Array, s: Array, sigma_data: float) -> Array:
    x = y + s * n
    return (y - _edm_skip(s, sigma_data) * x) / _edm_out(s, sigma_data)


#: Each target's exact value for x = y + σ n, from its definition (not via c_skip/c_out).
TRUTHS = {
    "x0": lambda y, n, s, d: y,
    "eps": lambda y, n, s, d: n,
    "v": _v_truth,
    "flow": lambda y, n, s, d: n - y,
    "edm": _edm_truth,
}


def ground_truth(target: str, y: Array, noise: Array, sigma: Array, sigma_data: float = 0.5) -> Array:
    """The exact value of ``target`` for x = y + σ n, from its definition (not via c_skip/c_out)."""
    _check(target)
    return TRUTHS[target](y, noise, _per_example(sigma, y), sigma_data)
