"""MLP denoisers for low-dimensional data (the 2D toys): F_θ(x_in, c_noise) -> [B, D].

Residual (the default): the noise level enters as in the U-Net: sinusoids of c_noise through a
small mapping network, added as a per-block scale/shift; output layers are zero-initialised so F
starts at 0 and the denoiser at its skip path.

Plain (``residual=False``): the textbook toy network, [x, c_noise] -> ``blocks`` x (Linear
``width``, SiLU) -> Linear D, default initialisers; with ``width=128, blocks=2`` on 2-D data it is
the 3 -> 128 -> 128 -> 2 MLP of the usual flow-matching tutorials:
``--config.model.residual=False --config.model.blocks=2``.
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp

from dew import registry
from dew.networks.unet import positional_embedding

_zeros = hk.initializers.Constant(0.0)


class MLP(hk.Module):
    """``blocks`` residual blocks (or, with ``residual=False``, ``blocks`` plain hidden layers) of
    width ``width`` over a flat sample [B, D]."""

    def __init__(self, width: int = 128, blocks: int = 3, residual: bool = True, name: str | None = None):
        super().__init__(name=name)
        if width < 2 or blocks < 1:
            raise ValueError(f"MLP: width must be >= 2 and blocks >= 1, got {width}, {blocks}")
        if not isinstance(residual, bool):
            raise ValueError(f"MLP: residual must be True or False, got {residual!r}")
        self.width, self.blocks, self.residual = width, blocks, residual

    def __call__(
        self,
        x: jax.Array,
        noise_level: jax.Array,
        *,
        label: jax.Array | None = None,
        is_training: bool = False,
    ) -> jax.Array:
        flat = x.reshape(x.shape[0], -1)
        if not self.residual:
            return _plain(self.width, self.blocks, flat, noise_level, label).reshape(x.shape)
        emb = positional_embedding(noise_level, self.width)
        if label is not None:
            emb = emb + hk.Linear(self.width, name="map_label")(label)
        emb = jax.nn.silu(hk.Linear(self.width, name="map_layer0")(emb))
        h = hk.Linear(self.width, name="proj_in")(flat)
        for i in range(self.blocks):
            scale, shift = jnp.split(hk.Linear(2 * self.width, name=f"affine{i}")(emb), 2, axis=-1)
            r = (
                hk.LayerNorm(-1, False, False, name=f"norm{i}")(h.astype(jnp.float32)).astype(h.dtype)
                * (1 + scale)
                + shift
            )
            r = hk.Linear(self.width, name=f"fc{i}_0")(jax.nn.silu(r))
            r = hk.Linear(self.width, w_init=_zeros, name=f"fc{i}_1")(jax.nn.silu(r))
            h = h + r
        out = hk.Linear(flat.shape[-1], w_init=_zeros, name="proj_out")(jax.nn.silu(h))
        return out.reshape(x.shape)


def _plain(
    width: int, blocks: int, flat: jax.Array, noise_level: jax.Array, label: jax.Array | None
) -> jax.Array:
    """The plain MLP's layers (a function, so haiku names them under the module's own scope)."""
    columns = [flat, jnp.broadcast_to(noise_level, flat.shape[:1])[:, None].astype(flat.dtype)]
    if label is not None:  # an encoded condition joins the input columns
        columns.append(label.reshape(label.shape[0], -1).astype(flat.dtype))
    h = jnp.concatenate(columns, axis=-1)
    for i in range(blocks):
        h = jax.nn.silu(hk.Linear(width, name=f"hidden{i}")(h))
    return hk.Linear(flat.shape[-1], name="proj_out")(h)


registry.models.register("mlp", MLP)
