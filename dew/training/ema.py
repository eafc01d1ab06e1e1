"""Exponential moving average of the parameters, zero-initialised and debiased on read.

With ema_0 = 0 and ema_n = β ema_{n−1} + (1 − β) θ_n, the weights on θ sum to 1 − βⁿ, so
ema_n / (1 − βⁿ) is an average (the same correction as Adam's moment estimates). Starting from
zero instead of from θ_0 keeps the random initialisation out of the average entirely.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Params = Any


def zeros_like(params: Params) -> Params:
    return jax.tree.map(jnp.zeros_like, params)


def update(ema: Params, params: Params, decay: float) -> Params:
    """One EMA step; pure, runs inside the jitted train step."""
    return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)


def debias(ema: Params, decay: float, num_updates: int | jax.Array) -> Params:
    """Bias-corrected EMA: ema / (1 − decay^num_updates).

    ``num_updates`` must be ≥ 1: after zero updates the EMA holds no information and the
    correction would divide by zero. A concrete 0 raises here; a traced count is clamped to 1 so
    a jitted caller gets a finite (zero) tree instead of NaNs.
    """
    if not isinstance(num_updates, jax.core.Tracer) and int(num_updates) < 1:
        raise ValueError(
            f"ema.debias: num_updates must be >= 1, got {int(num_updates)}; "
            "the EMA has not been updated yet, so there is nothing to debias"
        )
    if decay == 0.0:
        return ema
    n = jnp.maximum(jnp.asarray(num_updates, jnp.float32), 1.0)
    correction = 1.0 - jnp.asarray(decay, jnp.float32) ** n
    return jax.tree.map(lambda e: (e / correction).astype(e.dtype), ema)
