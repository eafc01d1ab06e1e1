"""DINOv2 as REPA loads and feeds it (sihyun-yu/REPA ``utils.py`` ``load_encoders``, ``train.py``):
the position grid resampled to the training resolution and REPA's own preprocessing, around
``dew.scoring.dinov2``'s ViT."""

from __future__ import annotations

import dataclasses

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew.scoring.dinov2 import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ViTConfig,
    antialiased_bicubic_matrix,
    bicubic_matrix,
)


def repa_config(config: ViTConfig, grid: int) -> ViTConfig:
    """``config`` with its position grid resampled to ``grid`` (what ``resample_position_embeddings``
    returns params for)."""
    return dataclasses.replace(config, train_grid=grid)


def resample_position_embeddings(params: hk.Params, config: ViTConfig, grid: int) -> hk.Params:
    """REPA's ``encoder.pos_embed.data = timm.layers.pos_embed.resample_abs_pos_embed(pos_embed,
    [grid, grid])``: the CLS position kept, the learned g×g grid resized to grid×grid by
    ``F.interpolate(mode='bicubic', antialias=True)`` (PIL's bicubic, a = −0.5, support scaled
    when shrinking). Host-side, once, in float64 then float32. The network for the result is
    ``repa_config(config, grid)``: at a grid×grid input its ``interpolate_pos_encoding`` keeps them
    as they are (``npatch == N and w == h``)."""
    g = config.train_grid
    pos = np.asarray(params["dinov2"]["pos_embed"], np.float64)
    m = antialiased_bicubic_matrix(g, grid).astype(np.float64)
    table = pos[0, 1:].reshape(g, g, -1)
    table = np.einsum("ab,bcd->acd", m, table)
    table = np.einsum("ec,acd->aed", m, table)
    resized = np.concatenate([pos[:, :1], table.reshape(1, grid * grid, -1)], axis=1).astype(np.float32)
    out = {k: dict(v) for k, v in params.items()}
    out["dinov2"]["pos_embed"] = jnp.asarray(resized)
    return out


def repa_preprocess(
    images: jax.Array, side: int, value_range: tuple[float, float] = (0.0, 255.0)
) -> jax.Array:
    """``preprocess_raw_image`` for DINOv2: x / 255, minus the ImageNet mean, over the std, then
    ``F.interpolate(x, side, mode='bicubic')`` (no antialias; the output size given, so the scale
    is in/out: source (i + 0.5)·in/out − 0.5, Keys' cubic A = −0.75, taps clamped). NHWC in
    ``value_range``, one channel repeated to three; → [N, side, side, 3] float32."""
    chex.assert_rank(images, 4)
    if images.shape[-1] == 1:
        images = jnp.repeat(images, 3, axis=-1)
    chex.assert_axis_dimension(images, 3, 3)
    lo, hi = value_range
    x = images.astype(jnp.float32)
    if (lo, hi) != (0.0, 255.0):
        x = (x - lo) * (255.0 / (hi - lo))
    x = x / 255.0
    x = (x - jnp.asarray(IMAGENET_MEAN, jnp.float32)) / jnp.asarray(IMAGENET_STD, jnp.float32)
    hp = jax.lax.Precision.HIGHEST
    rows = jnp.asarray(bicubic_matrix(images.shape[1], side, side / images.shape[1]))
    cols = jnp.asarray(bicubic_matrix(images.shape[2], side, side / images.shape[2]))
    x = jnp.einsum("oh,nhwc->nowc", rows, x, precision=hp)
    return jnp.einsum("pw,nowc->nopc", cols, x, precision=hp)


__all__ = ["repa_config", "repa_preprocess", "resample_position_embeddings"]
