"""Deterministic samplers of the probability-flow ODE dx/dσ = (x − D(x; σ)) / σ (EDM Eq. 3 with
σ(t) = t, s(t) = 1).

The contract of ``sample``: ``sigmas`` are the points from T down to the last point; a solver
step crosses each interval, then the model's clean prediction D(x; σ_last) is returned. The loop
is a ``lax.scan``, so the whole trajectory compiles into one program.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from dew import registry

Denoiser = Callable[[jax.Array, jax.Array], jax.Array]
"""D(x, σ): noisy batch and a scalar noise level -> the clean-sample estimate."""

Solver = Callable[[Denoiser, jax.Array, jax.Array, jax.Array], jax.Array]


def euler_step(denoise: Denoiser, x: jax.Array, sigma: jax.Array, sigma_next: jax.Array) -> jax.Array:
    """First-order step: x + (σ' − σ) d, with slope d = (x − D(x; σ)) / σ."""
    d = (x - denoise(x, sigma)) / sigma
    return x + (sigma_next - sigma) * d


def heun_step(denoise: Denoiser, x: jax.Array, sigma: jax.Array, sigma_next: jax.Array) -> jax.Array:
    """EDM Algorithm 1, lines 5-8: an Euler step, then the trapezoidal correction at σ'.

    σ' is never 0 here (the contract stops at the last point), so the correction always applies.
    """
    d = (x - denoise(x, sigma)) / sigma
    x_euler = x + (sigma_next - sigma) * d
    d_next = (x_euler - denoise(x_euler, sigma_next)) / sigma_next
    return x + (sigma_next - sigma) * 0.5 * (d + d_next)


SOLVERS: dict[str, Solver] = {"euler": euler_step, "heun": heun_step}
registry.samplers.register("euler", euler_step)
registry.samplers.register("heun", heun_step)


def sample(denoise: Denoiser, noise: jax.Array, sigmas: jax.Array, solver: str = "heun") -> jax.Array:
    """``len(sigmas)`` points from T to the last point: a solver step across each interval, then
    the model's clean prediction at the last point.

    ``noise`` is a standard normal batch; it is scaled by σ_0 here. NFE is (len(sigmas) − 1)
    for Euler and 2 (len(sigmas) − 1) for Heun, plus one for the final prediction.
    """
    if sigmas.ndim != 1 or sigmas.shape[0] < 2:
        raise ValueError(f"sample: sigmas must be a 1-D array of >= 2 points, got shape {sigmas.shape}")
    step = registry.samplers[solver]

    def body(x: jax.Array, interval: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        return step(denoise, x, interval[0], interval[1]), None

    x = noise * sigmas[0].astype(noise.dtype)
    x, _ = jax.lax.scan(body, x, (sigmas[:-1], sigmas[1:]))
    return denoise(x, sigmas[-1])
