"""A residual MLP denoiser for low-dimensional data (the 2D toys): F_θ(x_in, c_noise) -> [B, D].

The noise level enters as in the U-Net: sinusoids of c_noise through a small mapping network,
added as a per-block scale/shift. Output layers are zero-initialised so F starts at 0 and the
denoiser at its skip path.
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp

from dew import registry
from dew.networks.unet import positional_embedding

_zeros = hk.initializers.Constant(0.0)


class MLP(hk.Module):
    """``blocks`` residual blocks of width ``width`` over a flat sample [B, D]."""

    def __init__(self, width: int = 128, blocks: int = 3, name: str | None = None):
        super().__init__(name=name)
        if width < 2 or blocks < 1:
            raise ValueError(f"MLP: width must be >= 2 and blocks >= 1, got {width}, {blocks}")
        self.width, self.blocks = width, blocks

    def __call__(
        self,
        x: jax.Array,
        noise_level: jax.Array,
        *,
        label: jax.Array | None = None,
        is_training: bool = False,
    ) -> jax.Array:
        flat = x.reshape(x.shape[0], -1)
        emb = positional_embedding(noise_level, self.width)
        if label is not None:
            emb = emb + hk.Linear(self.width, name="map_label")(label)
        emb = jax.nn.silu(hk.Linear(self.width, name="map_layer0")(emb))
        h = hk.Linear(self.width, name="proj_in")(flat)
        for i in range(self.blocks):
            scale, shift = jnp.split(hk.Linear(2 * self.width, name=f"affine{i}")(emb), 2, axis=-1)
            r = hk.LayerNorm(-1, False, False, name=f"norm{i}")(h) * (1 + scale) + shift
            r = hk.Linear(self.width, name=f"fc{i}_0")(jax.nn.silu(r))
            r = hk.Linear(self.width, w_init=_zeros, name=f"fc{i}_1")(jax.nn.silu(r))
            h = h + r
        out = hk.Linear(flat.shape[-1], w_init=_zeros, name="proj_out")(jax.nn.silu(h))
        return out.reshape(x.shape)


registry.models.register("mlp", MLP)
