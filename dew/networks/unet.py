"""A compact U-Net for small images: DDPM++-like, but not NVlabs/edm's SongUNet.

For EDM's exact networks (published configurations, converted weights) use
``dew.models["songunet"]`` or ``["dhariwalunet"]``. This one has fewer and simpler modules:
residual blocks with group norm and SiLU, the noise level entering every block
as a scale/shift after the second norm (as EDM's ``adaptive_scale=True``, which NVlabs/edm uses in
DhariwalUNet, not in SongUNet), self-attention at the listed resolutions in every block there,
positional noise embedding, additive class embedding, strided-convolution downsampling and
resize-then-convolve upsampling, skip connections scaled by √½, and zero-initialised output
layers so each block starts as the identity. ``experiments/flowers.py`` and
``experiments/text_to_image.py`` train it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from dew import registry
from dew.networks.dropout import dropout as apply_dropout

_SKIP_SCALE = math.sqrt(0.5)
_zeros = hk.initializers.Constant(0.0)


def _groups(channels: int) -> int:
    """EDM uses 32 groups of at least 4 channels; narrow CPU models get fewer groups, and the
    count must divide the channels."""
    return next(g for g in range(min(32, max(1, channels // 4)), 0, -1) if channels % g == 0)


def positional_embedding(noise_level: jax.Array, dim: int, max_positions: int = 10000) -> jax.Array:
    """Transformer-style sinusoids of c_noise (DDPM++'s ``PositionalEmbedding``), [B] -> [B, dim]."""
    freqs = jnp.arange(dim // 2, dtype=jnp.float32) / (dim // 2)
    freqs = (1.0 / max_positions) ** freqs
    angles = noise_level.astype(jnp.float32)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)


class ResBlock(hk.Module):
    """GN-SiLU-conv, noise-adaptive scale/shift, GN-SiLU-dropout-conv, √½-scaled skip."""

    def __init__(self, channels: int, attention: bool, dropout: float, name: str | None = None):
        super().__init__(name=name)
        self.channels = channels
        self.attention = attention
        self.dropout = dropout

    def __call__(self, x: jax.Array, emb: jax.Array, is_training: bool) -> jax.Array:
        skip = x
        h = jax.nn.silu(hk.GroupNorm(_groups(x.shape[-1]), name="norm0")(x))
        h = hk.Conv2D(self.channels, 3, name="conv0")(h)
        scale, shift = jnp.split(hk.Linear(2 * self.channels, name="affine")(emb), 2, axis=-1)
        h = hk.GroupNorm(_groups(self.channels), name="norm1")(h)
        h = jax.nn.silu(h * (1.0 + scale[:, None, None, :]) + shift[:, None, None, :])
        if is_training and self.dropout > 0:
            h = apply_dropout(hk.next_rng_key(), self.dropout, h)
        h = hk.Conv2D(self.channels, 3, w_init=_zeros, name="conv1")(h)
        if skip.shape[-1] != self.channels:
            skip = hk.Conv2D(self.channels, 1, name="skip")(skip)
        x = (h + skip) * _SKIP_SCALE
        if self.attention:
            x = (x + SelfAttention(name="attn")(x)) * _SKIP_SCALE
        return x


class SelfAttention(hk.Module):
    """Single-head attention over all pixels, as DDPM++ uses at its 16x16 level."""

    def __call__(self, x: jax.Array) -> jax.Array:
        b, h, w, c = x.shape
        qkv = hk.Conv2D(3 * c, 1, name="qkv")(hk.GroupNorm(_groups(c), name="norm")(x))
        q, k, v = jnp.split(qkv.reshape(b, h * w, 3 * c), 3, axis=-1)
        weights = jax.nn.softmax(jnp.einsum("bqc,bkc->bqk", q, k) / math.sqrt(c), axis=-1)
        out = jnp.einsum("bqk,bkc->bqc", weights, v).reshape(b, h, w, c)
        return hk.Conv2D(c, 1, w_init=_zeros, name="proj")(out)


class UNet(hk.Module):
    """F_θ(x_in, c_noise[, h], label_embedding) -> raw output of x's shape.

    ``label`` is an already-encoded conditioning vector [B, D] (an encoder from
    ``dew.registry.encoders`` makes it), added to the noise embedding as DDPM++ does with its
    class map; ``None`` means unconditional. ``h`` [B] is an optional second time input (MeanFlow's
    h = t − r, ``dew.objectives.meanflow``): its positional embedding, through its own linear map
    ``map_h``, is added to the noise embedding as MeanFlow's DiT adds its second time embedding.
    Without ``h`` the network, its parameters and its outputs are exactly those of before.
    """

    def __init__(
        self,
        channels: int = 64,
        channel_mult: Sequence[int] = (1, 2, 2),
        num_blocks: int = 2,
        attn_resolutions: Sequence[int] = (4,),
        dropout: float = 0.0,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.channels = channels
        self.channel_mult = tuple(channel_mult)
        self.num_blocks = num_blocks
        self.attn_resolutions = tuple(attn_resolutions)
        self.dropout = dropout

    def __call__(
        self,
        x: jax.Array,
        noise_level: jax.Array,
        h: jax.Array | None = None,
        *,
        label: jax.Array | None = None,
        is_training: bool = False,
    ) -> jax.Array:
        emb_dim = 4 * self.channels
        # times are embedded in float32, then computed in x's dtype (the precision policy's)
        emb = positional_embedding(noise_level, self.channels).astype(x.dtype)
        if h is not None:
            emb = emb + hk.Linear(self.channels, name="map_h")(
                positional_embedding(h, self.channels).astype(x.dtype)
            )
        if label is not None:
            emb = emb + hk.Linear(self.channels, name="map_label")(label.astype(x.dtype))
        emb = jax.nn.silu(hk.Linear(emb_dim, name="map_layer0")(emb))
        emb = jax.nn.silu(hk.Linear(emb_dim, name="map_layer1")(emb))

        # y: the feature map (h, the parameter, is MeanFlow's interval t − r)
        y = hk.Conv2D(self.channels, 3, name="conv_in")(x)
        skips = [y]
        for level, mult in enumerate(self.channel_mult):
            res = x.shape[1] >> level
            for i in range(self.num_blocks):
                y = ResBlock(
                    self.channels * mult,
                    res in self.attn_resolutions,
                    self.dropout,
                    name=f"enc{res}_block{i}",
                )(y, emb, is_training)
                skips.append(y)
            if level < len(self.channel_mult) - 1:
                y = hk.Conv2D(y.shape[-1], 3, stride=2, name=f"enc{res}_down")(y)
                skips.append(y)

        mid = self.channels * self.channel_mult[-1]
        y = ResBlock(mid, True, self.dropout, name="mid_block0")(y, emb, is_training)
        y = ResBlock(mid, False, self.dropout, name="mid_block1")(y, emb, is_training)

        for level, mult in reversed(list(enumerate(self.channel_mult))):
            res = x.shape[1] >> level
            for i in range(self.num_blocks + 1):
                y = jnp.concatenate([y, skips.pop()], axis=-1)
                y = ResBlock(
                    self.channels * mult,
                    res in self.attn_resolutions,
                    self.dropout,
                    name=f"dec{res}_block{i}",
                )(y, emb, is_training)
            if level > 0:
                b, hh, ww, c = y.shape
                y = jax.image.resize(y, (b, 2 * hh, 2 * ww, c), method="nearest")
                y = hk.Conv2D(c, 3, name=f"dec{res}_up")(y)

        y = jax.nn.silu(hk.GroupNorm(_groups(y.shape[-1]), name="norm_out")(y))
        return hk.Conv2D(x.shape[-1], 3, w_init=_zeros, name="conv_out")(y)


registry.models.register("unet", UNet)
