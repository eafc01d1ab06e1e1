"""A small space-time U-Net for clips [B, T, H, W, C] (haiku), the video counterpart of
``dew.networks.unet.UNet`` with the same call signature, so the same EDM objective trains it.

Residual blocks use (2+1)-D convolutions (Tran et al. 2018, "A Closer Look at Spatiotemporal
Convolutions"): a 3x3 convolution over the pixels of each frame followed by a 3-tap convolution
over the frames at each pixel, with group norm, SiLU and the noise level as an adaptive
scale/shift. Against a full 3x3x3 kernel this has 12/27 of the multiply-adds at equal width, and
its spatial part runs as 2-D convolutions over the B·T frames, which XLA:CPU executes far faster
than 3-D ones (with 3x3x3 kernels, a train step at 32 channels and 32 clips took 22 s here).
Resolution is halved in space only (time keeps every frame); at the lowest resolution a
factorised attention block attends over space within each frame, then over time at each
position (with a learned embedding of the frame index, so attention knows the frame order).
Skip connections are scaled by √½ and output layers are zero-initialised, as in the image U-Net.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from dew import registry
from dew.networks.unet import _groups, positional_embedding

_SKIP = math.sqrt(0.5)
_zeros = hk.initializers.Constant(0.0)


def _per_frame(module: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """Apply an image module [N, H, W, C] -> [N, H', W', C'] to every frame of [B, T, H, W, C]."""
    b, t = x.shape[:2]
    y = module(x.reshape(b * t, *x.shape[2:]))
    return y.reshape(b, t, *y.shape[1:])


class TemporalConv(hk.Module):
    """A 3-tap convolution along time at every pixel, zero-padded at the clip's ends:
    y[t] = Σ_k x[t + k - 1] W_k + b, computed as one [B·T·H·W, 3C] x [3C, C'] matmul over the
    three time-shifted copies side by side (three separate matmuls made this network's
    gradient 20 % slower here: 971 vs 813 ms at 16 clips, 16 channels)."""

    def __init__(
        self, channels: int, w_init: hk.initializers.Initializer | None = None, name: str | None = None
    ):
        super().__init__(name=name)
        self.channels, self.w_init = channels, w_init

    def __call__(self, x: jax.Array) -> jax.Array:
        c_in, t = x.shape[-1], x.shape[1]
        w_init = self.w_init or hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")
        w = hk.get_parameter("w", (3, c_in, self.channels), x.dtype, init=w_init)
        b = hk.get_parameter("b", (self.channels,), x.dtype, init=jnp.zeros)
        padded = jnp.pad(x, ((0, 0), (1, 1), (0, 0), (0, 0), (0, 0)))
        shifted = jnp.concatenate([padded[:, k : k + t] for k in range(3)], axis=-1)
        return jnp.dot(shifted, w.reshape(3 * c_in, self.channels)) + b


class Conv2Plus1D(hk.Module):
    """A 3x3 convolution over each frame's pixels, then a 3-tap convolution over the frames."""

    def __init__(self, channels: int, zero_init: bool = False, name: str | None = None):
        super().__init__(name=name)
        self.channels, self.zero_init = channels, zero_init

    def __call__(self, x: jax.Array) -> jax.Array:
        h = _per_frame(hk.Conv2D(self.channels, 3, name="space"), x)
        return TemporalConv(self.channels, w_init=_zeros if self.zero_init else None, name="time")(h)


class Block3D(hk.Module):
    """GN-SiLU-Conv(2+1)D, noise scale/shift, GN-SiLU-Conv(2+1)D (zero init), √½-scaled skip."""

    def __init__(self, channels: int, name: str | None = None):
        super().__init__(name=name)
        self.channels = channels

    def __call__(self, x: jax.Array, emb: jax.Array) -> jax.Array:
        h = jax.nn.silu(hk.GroupNorm(_groups(x.shape[-1]), name="norm0")(x))
        h = Conv2Plus1D(self.channels, name="conv0")(h)
        scale, shift = jnp.split(hk.Linear(2 * self.channels, name="affine")(emb), 2, axis=-1)
        h = hk.GroupNorm(_groups(self.channels), name="norm1")(h)
        h = jax.nn.silu(h * (1 + scale[:, None, None, None]) + shift[:, None, None, None])
        h = Conv2Plus1D(self.channels, zero_init=True, name="conv1")(h)
        skip = x if x.shape[-1] == self.channels else hk.Linear(self.channels, name="skip")(x)
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
        frame = hk.get_parameter(
            "frame_embedding", (t, c), x.dtype, init=hk.initializers.TruncatedNormal(0.02)
        )
        time = (x + frame[None, :, None, None]).transpose(0, 2, 3, 1, 4).reshape(b * h * w, t, c)
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
        h = _per_frame(hk.Conv2D(self.channels, 3, name="conv_in"), x)
        skips = [h]
        for level, mult in enumerate(self.channel_mult):
            for i in range(self.num_blocks):
                h = Block3D(self.channels * mult, name=f"enc{level}_{i}")(h, emb)
                skips.append(h)
            if level < len(self.channel_mult) - 1:
                h = _per_frame(hk.Conv2D(h.shape[-1], 3, stride=2, name=f"down{level}"), h)
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
                h = _per_frame(hk.Conv2D(c, 3, name=f"up{level}"), h)
        h = jax.nn.silu(hk.GroupNorm(_groups(h.shape[-1]), name="norm_out")(h))
        return _per_frame(hk.Conv2D(x.shape[-1], 3, w_init=_zeros, name="conv_out"), h)


registry.models.register("video_unet", VideoUNet)
