"""How the diffusion objective calls its network, as pure functions: the function ``hk.transform``
makes the network of (each condition through its encoder), the denoiser D(x; σ) under dew's
precision policy, and condition dropout (a condition replaced by its unconditional datum, so the
same network serves as CFG's unconditional branch).

Nothing here holds or reads an objective: ``dew.objectives.diffusion.Diffusion`` calls these with
its model, encoders, process, compute dtype and unconditional tokens, so each piece can be read
and tested alone; a subclass with another network interface (``EDM2``) replaces the methods that
call them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.contracts.objective import Params
from dew.contracts.precision import cast_floats
from dew.diffusion.process import Process
from dew.objectives.diffusion_sampling import Denoiser, unconditional

# A haiku module's constructor: called inside the transform, the module it returns is applied.
ModuleFactory = Callable[[], Callable[..., Any]]


def conditioned_forward(
    model: ModuleFactory, encoders: Mapping[str, ModuleFactory]
) -> Callable[..., jax.Array]:
    """(x, noise level, conditions, is_training, augment labels or None) -> the network's output,
    each condition through its encoder and passed under its key (augment labels, when given, as
    ``augment_labels``): the function ``hk.transform`` makes the objective's network of."""

    def forward(
        x: jax.Array,
        noise_level: jax.Array,
        conditions: Mapping[str, jax.Array],
        is_training: bool,
        augment_labels: jax.Array | None = None,
    ):
        encoded = {k: encoders[k]()(v) for k, v in conditions.items()}
        if augment_labels is not None:
            encoded["augment_labels"] = augment_labels
        return model()(x, noise_level, is_training=is_training, **encoded)

    return forward


def precision_denoiser(
    apply: Callable[..., jax.Array],
    process: Process,
    compute_dtype: jnp.dtype,
    params: Params,
    conditions: Mapping[str, jax.Array],
    rng: jax.Array | None = None,
    is_training: bool = False,
    augment_labels: jax.Array | None = None,
) -> Denoiser:
    """D(x, σ) = ``process.denoise`` around the network ``apply`` (``conditioned_forward``'s,
    transformed) with ``params`` for fixed ``conditions``; σ may be a scalar or per-example [B].

    The precision policy (docs/precision.md): with ``compute_dtype`` float32 the network runs on
    the values as they are; otherwise F runs in the compute dtype on float32 parameters cast at
    use (its input and augment labels cast too) and its output returns to float32, while
    c_noise, the σ arithmetic around F (c_in, c_skip, c_out) and the loss stay float32, as
    EDMPrecond computes them."""

    def denoise(x: jax.Array, sigma: jax.Array) -> jax.Array:
        sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (x.shape[0],))

        def network(x_in: jax.Array, c_noise: jax.Array) -> jax.Array:
            if compute_dtype == jnp.float32:
                return apply(params, rng, x_in, c_noise, conditions, is_training, augment_labels)
            dt = compute_dtype
            labels = None if augment_labels is None else augment_labels.astype(dt)
            out = apply(
                cast_floats(params, dt), rng, x_in.astype(dt), c_noise, conditions, is_training, labels
            )
            return out.astype(jnp.float32)

        return process.denoise(network, x, sigma)

    return denoise


def drop_conditions(
    rng: jax.Array,
    conditions: Mapping[str, jax.Array],
    rate: float,
    unconditional_tokens: Mapping[str, np.ndarray],
) -> dict[str, jax.Array]:
    """Each row of each condition kept with probability 1 − ``rate`` and otherwise replaced by
    the condition's unconditional datum (``unconditional_tokens[key]``); one key of ``rng`` per
    condition, in key order."""
    out = {}
    for (key, value), k in zip(
        sorted(conditions.items()), jax.random.split(rng, len(conditions)), strict=True
    ):
        keep = jax.random.uniform(k, value.shape[:1]) >= rate
        out[key] = jnp.where(
            keep.reshape((-1,) + (1,) * (value.ndim - 1)),
            value,
            unconditional(unconditional_tokens[key], value),
        )
    return out


__all__ = ["ModuleFactory", "conditioned_forward", "drop_conditions", "precision_denoiser"]
