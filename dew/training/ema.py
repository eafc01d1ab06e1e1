"""Exponential moving average of the parameters, zero-initialised and debiased on read.

With ema_0 = 0 and ema_n = β_n ema_{n−1} + (1 − β_n) θ_n, the weights on the θ's sum to
1 − Π β_i, so ema_n / (1 − Π β_i) is an average (the same correction as Adam's moment
estimates; for a constant β it is ema / (1 − βⁿ)). Starting from zero instead of from θ_0 keeps
the random initialisation out of the average entirely. ``EMASpec`` (``dew.objectives.base``)
says which leaves are averaged and how β_n evolves; untracked leaves hold the live parameter.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dew.objectives.base import EMASpec

Params = Any


def zeros_like(params: Params, spec: EMASpec | None = None) -> Params:
    """The EMA before any update: zeros where tracked, the live parameter where not."""
    if spec is None or spec.tracks is None:
        return jax.tree.map(jnp.zeros_like, params)
    return jax.tree.map(lambda p, m: jnp.zeros_like(p) if m else p, params, spec.mask(params))


def update(ema: Params, params: Params, decay: float | EMASpec, num_updates: jax.Array | int = 1) -> Params:
    """The EMA after the ``num_updates``-th optimizer update (n ≥ 1); pure, runs inside jit.

    ``decay`` is a constant β or an ``EMASpec`` (β_n from its half-life/ramp-up, and its
    ``tracks`` predicate: untracked leaves copy the live parameter).
    """
    spec = decay if isinstance(decay, EMASpec) else EMASpec(decay=float(decay))
    beta = spec.decay_at(num_updates)

    def one(e: jax.Array, p: jax.Array, tracked: bool) -> jax.Array:
        if not tracked:
            return p
        return (beta * e + (1.0 - beta) * p).astype(e.dtype)

    return jax.tree.map(one, ema, params, spec.mask(params))


def debias(ema: Params, decay: float | EMASpec, num_updates: int | jax.Array) -> Params:
    """Bias-corrected EMA: ema / (1 − Π_{i≤n} β_i), i.e. ema / (1 − decayⁿ) for a constant decay.

    ``num_updates`` must be ≥ 1: after zero updates the EMA holds no information and the
    correction would divide by zero. A concrete 0 raises here; a traced count is clamped to 1 so
    a jitted caller gets a finite (zero) tree instead of NaNs. Untracked leaves (``EMASpec.tracks``)
    already hold the live parameter and are returned unchanged.
    """
    if not isinstance(num_updates, jax.core.Tracer) and int(num_updates) < 1:
        raise ValueError(
            f"ema.debias: num_updates must be >= 1, got {int(num_updates)}; "
            "the EMA has not been updated yet, so there is nothing to debias"
        )
    spec = decay if isinstance(decay, EMASpec) else EMASpec(decay=float(decay))
    if spec.half_life is None and spec.decay == 0.0:
        return ema
    n = jnp.maximum(jnp.asarray(num_updates, jnp.float32), 1.0)
    correction = 1.0 - spec.retained(n)

    def one(e: jax.Array, tracked: bool) -> jax.Array:
        return (e / correction).astype(e.dtype) if tracked else e

    return jax.tree.map(one, ema, spec.mask(ema))


def get_debiased_ema(ema_params: Params, decay: float, num_updates: int | jax.Array) -> Params:
    """Bias-corrected EMA (Adam convention): ``ema_params / (1 - decay ** num_updates)``.

    Assumes ``ema_params`` was zero-initialised and has been updated ``num_updates`` times; the
    result is unbiased under stationary-parameter expectations, with the structure of
    ``ema_params``. Must not be called with ``num_updates == 0`` (division by zero: a concrete 0
    raises ``ValueError``). The stix name of ``debias`` with a constant decay.
    """
    return debias(ema_params, float(decay), num_updates)
