"""A small space-time U-Net for clips [B, T, H, W, C] (haiku), the video counterpart of
``dew.networks.unet.UNet`` with the same call signature, so the same EDM objective trains it.

Residual blocks use 3-D convolutions (3x3x3: time and space together) with group norm, SiLU and
the noise level as an adaptive scale/shift; resolution is halved in space only (time keeps every
frame); at the lowest resolution a factorised attention block attends over space within each
frame, then over time at each position. Skip connections are scaled by √½ and output layers are
zero-initialised, as in the image U-Net.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from dew import registry
from dew.networks.unet import _groups, positional_embedding

_SKIP = math.sqrt(0.5)
_zeros = hk.initializers.Constant(0.0)


class Block3D(hk.Module):
    """GN-SiLU-Conv3D, noise scale/shift, GN-SiLU-Conv3D (zero init), √½-scaled skip."""

    def __init__(self, channels: int, name: str | None = None):
        super().__init__(name=name)
        self.channels = channels

    def __call__(self, x: jax.Array, emb: jax.Array) -> jax.Array:
        h = jax.nn.silu(hk.GroupNorm(_groups(x.shape[-1]), name="norm0")(x))
        h = hk.Conv3D(self.channels, 3, name="conv0")(h)
        scale, shift = jnp.split(hk.Linear(2 * self.channels, name="affine")(emb), 2, axis=-1)
        h = hk.GroupNorm(_groups(self.channels), name="norm1")(h)
        h = jax.nn.silu(h * (1 + scale[:, None, None, None]) + shift[:, None, None, None])
        h = hk.Conv3D(self.channels, 3, w_init=_zeros, name="conv1")(h)
        skip = x if x.shape[-1] == self.channels else hk.Conv3D(self.channels, 1, name="skip")(x)
        return (h + skip) * _SKIP


class FactorisedAttention(hk.Module):
    """Single-head attention over the pixels of each frame, then over the frames at each pixel."""

    def _attend(self, x: jax.Array, name: str) -> jax.Array:  # x: [G, L, C], attend along L
        c = x.shape[-1]
        qkv = hk.Linear(3 * c, name=f"{name}_qkv")(hk.LayerNorm(-1, True, True, name=f"{name}_norm")(x))
        q, k, v = jnp.split(qkv, 3, axis=-1)
        w = jax.nn.softmax(jnp.einsum("gqc,gkc->gqk", q, k) / math.sqrt(c), axis=-1)
        return hk.Linear(c, w_init=_zeros, name=f"{name}_proj")(jnp.einsum("gqk,gkc->gqc", w, v))

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, h, w, c = x.shape
        space = x.reshape(b * t, h * w, c)
        x = (x + self._attend(space, "space").reshape(x.shape)) * _SKIP
        time = x.transpose(0, 2, 3, 1, 4).reshape(b * h * w, t, c)
        out = self._attend(time, "time").reshape(b, h, w, t, c).transpose(0, 3, 1, 2, 4)
        return (x + out) * _SKIP


class VideoUNet(hk.Module):
    """F_θ(x_in [B, T, H, W, C], c_noise [B], label embedding [B, D] or None) -> [B, T, H, W, C]."""

    def __init__(
        self,
        channels: int = 32,
        channel_mult: Sequence[int] = (1, 2),
        num_blocks: int = 1,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.channels, self.channel_mult, self.num_blocks = channels, tuple(channel_mult), num_blocks

    def __call__(
        self,
        x: jax.Array,
        noise_level: jax.Array,
        *,
        label: jax.Array | None = None,
        is_training: bool = False,
    ) -> jax.Array:
        del is_training  # no dropout
        if x.ndim != 5:
            raise ValueError(f"VideoUNet: x must be [B, T, H, W, C], got shape {x.shape}")
        if x.shape[2] % (1 << (len(self.channel_mult) - 1)):
            raise ValueError(f"VideoUNet: height {x.shape[2]} must halve {len(self.channel_mult) - 1} times")
        emb = positional_embedding(noise_level, self.channels)
        if label is not None:
            emb = emb + hk.Linear(self.channels, name="map_label")(label)
        emb = jax.nn.silu(hk.Linear(4 * self.channels, name="map0")(emb))
        emb = jax.nn.silu(hk.Linear(4 * self.channels, name="map1")(emb))
        h = hk.Conv3D(self.channels, 3, name="conv_in")(x)
        skips = [h]
        for level, mult in enumerate(self.channel_mult):
            for i in range(self.num_blocks):
                h = Block3D(self.channels * mult, name=f"enc{level}_{i}")(h, emb)
                skips.append(h)
            if level < len(self.channel_mult) - 1:
                h = hk.Conv3D(h.shape[-1], 3, stride=(1, 2, 2), name=f"down{level}")(h)
                skips.append(h)
        h = Block3D(h.shape[-1], name="mid0")(h, emb)
        h = FactorisedAttention(name="mid_attn")(h)
        h = Block3D(h.shape[-1], name="mid1")(h, emb)
        for level, mult in reversed(list(enumerate(self.channel_mult))):
            for i in range(self.num_blocks + 1):
                h = jnp.concatenate([h, skips.pop()], axis=-1)
                h = Block3D(self.channels * mult, name=f"dec{level}_{i}")(h, emb)
            if level > 0:
                b, t, hh, ww, c = h.shape
                h = jax.image.resize(h, (b, t, 2 * hh, 2 * ww, c), "nearest")
                h = hk.Conv3D(c, 3, name=f"up{level}")(h)
        h = jax.nn.silu(hk.GroupNorm(_groups(h.shape[-1]), name="norm_out")(h))
        return hk.Conv3D(x.shape[-1], 3, w_init=_zeros, name="conv_out")(h)


registry.models.register("video_unet", VideoUNet)
