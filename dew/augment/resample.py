"""The geometric warp of NVlabs/edm ``AugmentPipe.__call__`` ("Execute geometric transformations"):
reflect-pad by a margin that covers the transformed image, upsample 2x with the ``sym6`` wavelet
low-pass filter, sample the inverse transform bilinearly (``affine_grid`` + ``grid_sample``,
``align_corners=False``, zeros outside), then filter, downsample 2x and crop.

The reference's margin depends on the draws (the batch's largest transformed corner), so its
padded image has a data-dependent shape. Here the image is reflect-padded once by the largest
margin the reference allows (H-1, W-1) into a static canvas, and everything outside the
reference's own padded window is zeroed: the upsampling filter then sees exactly the values (and
zeros) the reference's does, and a sample outside the window is zero exactly where the
reference's ``padding_mode='zeros'`` makes it so. Shapes stay static under ``jit``.

The margin is the whole (global) batch's, as one reference process computes it for its batch; a
different margin changes the images only by rounding (forcing it to its maximum moved the
goldens' outputs by at most 1.4e-5), so a data-parallel reference run, each GPU padding by its
own share's margin, is matched as well.
Layout: images are [N, H, W, C] (the reference's are [N, C, H, W]).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dew.augment import matrices as m

# NVlabs/edm training/augment.py ``wavelets['sym6']``: the Symlet-6 low-pass decomposition filter.
SYM6 = (
    0.015404109327027373,
    0.0034907120842174702,
    -0.11799011114819057,
    -0.048311742585633,
    0.4910559419267466,
    0.787641141030194,
    0.3379294217276218,
    -0.07263752278646252,
    -0.021060292512300564,
    0.04472490177066578,
    0.0017677118642428036,
    -0.007800708325034148,
)
HZ = np.asarray(SYM6, dtype=np.float32)
HZ_PAD = len(HZ) // 4  # 3: the border (in input pixels) kept around the image while warping


def _correlate(x: jax.Array, taps: np.ndarray, axis: int, pad: int, stride: int = 1) -> jax.Array:
    """``conv2d`` along one axis (cross-correlation, zero ``pad`` each side, ``stride``), as a sum
    over the taps in order; in float32 elementwise arithmetic."""
    x = jnp.moveaxis(x, axis, -1)
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)])
    length = (x.shape[-1] - len(taps)) // stride + 1
    out = None
    for k, tap in enumerate(taps):
        term = jnp.float32(tap) * x[..., k : k + (length - 1) * stride + 1 : stride]
        out = term if out is None else out + term
    assert out is not None, "a filter has at least one tap"
    return jnp.moveaxis(out, -1, axis)


def _upsample(x: jax.Array, axis: int) -> jax.Array:
    """The reference's ``stack([x, 0]).reshape(...)[:-1]`` (zeros between samples, length 2L-1)
    then ``conv2d`` with the flipped filter and padding (len+1)//2: length 2L.

    Computed polyphase: output 2t sums the flipped filter's even taps over x[t-3 .. t+2], output
    2t+1 its odd taps over x[t-2 .. t+3], in the taps' order. The terms dropped are the zero-
    inserted samples' exact zeros, so the sums round exactly as the zero-inserted ones do."""
    x = jnp.moveaxis(x, axis, -1)
    length = x.shape[-1]
    taps = HZ[::-1]
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(3, 3)])
    phases = []
    for phase, offset in ((0, 0), (1, 1)):
        out = None
        for q, tap in enumerate(taps[phase::2]):
            term = jnp.float32(tap) * padded[..., q + offset : q + offset + length]
            out = term if out is None else out + term
        phases.append(out)
    out = jnp.stack(phases, axis=-1).reshape(*x.shape[:-1], 2 * length)
    return jnp.moveaxis(out, -1, axis)


def _downsample(x: jax.Array, axis: int) -> jax.Array:
    """The filter with padding (len-1)//2 and stride 2, then ``HZ_PAD`` cropped each side."""
    out = _correlate(x, HZ, axis, (len(HZ) - 1) // 2, stride=2)
    return jax.lax.slice_in_dim(out, HZ_PAD, out.shape[axis] - HZ_PAD, axis=axis)


def _linspace_from_neg_one(steps: int) -> np.ndarray:
    """``affine_grid``'s base coordinates (align_corners=False): ``linspace(-1, 1, steps)`` as
    torch's CPU kernel forms it in float32, times (steps-1)/steps."""
    one = np.float32(1)
    step = np.float32(2) / np.float32(steps - 1)
    half = steps // 2
    idx = np.arange(steps)
    lin = np.where(
        idx < half,
        np.float32(-1) + step * idx.astype(np.float32),
        one - step * (steps - idx - 1).astype(np.float32),
    ).astype(np.float32)
    return ((lin * np.float32(steps - 1)).astype(np.float32) / np.float32(steps)).astype(np.float32)


def warp(images: jax.Array, g_inv: jax.Array) -> jax.Array:
    """The images [N, H, W, C] resampled through the inverse transforms ``g_inv`` [N, 3, 3]
    (output pixel -> input pixel, centred coordinates), the reference's numerics."""
    n, h, w, c = images.shape
    chex.assert_shape(g_inv, (n, 3, 3))
    cx, cy = (w - 1) / 2, (h - 1) / 2

    # Margin: the batch's transformed corners, plus the filter's reach, within [0, size-1].
    corners = jnp.asarray([[-cx, -cy, 1], [cx, -cy, 1], [cx, cy, 1], [-cx, cy, 1]], jnp.float32)
    cp = jnp.sum(g_inv[:, :, :, None] * corners.T[None, None, :, :], axis=2)  # [N, xyz, corner]
    xs, ys = cp[:, 0, :].reshape(-1), cp[:, 1, :].reshape(-1)
    margin = jnp.stack([jnp.max(-xs), jnp.max(-ys), jnp.max(xs), jnp.max(ys)])
    margin = margin + jnp.asarray([HZ_PAD * 2 - cx, HZ_PAD * 2 - cy] * 2, jnp.float32)
    margin = jnp.maximum(margin, jnp.zeros(4, jnp.float32))
    margin = jnp.minimum(margin, jnp.asarray([w - 1, h - 1] * 2, jnp.float32))
    mx0, my0, mx1, my1 = jnp.ceil(margin).astype(jnp.int32)

    # Reflect-pad into the static canvas; zero what lies outside the reference's padded window.
    canvas = jnp.pad(images, ((0, 0), (h - 1, h - 1), (w - 1, w - 1), (0, 0)), mode="reflect")
    rows = jnp.arange(canvas.shape[1]) - (h - 1)
    cols = jnp.arange(canvas.shape[2]) - (w - 1)
    inside = ((rows >= -my0) & (rows < h + my1))[:, None] & ((cols >= -mx0) & (cols < w + mx1))[None, :]
    canvas = jnp.where(inside[None, :, :, None], canvas, jnp.zeros((), canvas.dtype))
    g_inv = m.compose(m.translate2d((mx0 - mx1) / 2, (my0 - my1) / 2, n), g_inv)

    # Upsample.
    up = _upsample(_upsample(canvas, 2), 1)
    g_inv = m.compose(m.scale2d(2, 2, n), g_inv, m.scale2d_inv(2, 2, n))
    g_inv = m.compose(m.translate2d(-0.5, -0.5, n), g_inv, m.translate2d_inv(-0.5, -0.5, n))

    # Execute the transformation on the reference's upsampled window (2Hp x 2Wp).
    out_h, out_w = (h + HZ_PAD * 2) * 2, (w + HZ_PAD * 2) * 2
    hp, wp = h + my0 + my1, w + mx0 + mx1
    # 2 / images.shape[3] in the reference is a double rounded to float32: a table by margin.
    inv_w = jnp.asarray([2 / (2 * (w + k)) for k in range(2 * w - 1)], jnp.float32)[mx0 + mx1]
    inv_h = jnp.asarray([2 / (2 * (h + k)) for k in range(2 * h - 1)], jnp.float32)[my0 + my1]
    g_inv = m.compose(m.scale2d(inv_w, inv_h, n), g_inv, m.scale2d_inv(2 / out_w, 2 / out_h, n))
    theta = g_inv[:, :2, :]
    base_x = jnp.asarray(_linspace_from_neg_one(out_w))[None, None, :]
    base_y = jnp.asarray(_linspace_from_neg_one(out_h))[None, :, None]
    grid_x = (
        base_x * theta[:, 0, 0, None, None] + base_y * theta[:, 0, 1, None, None] + theta[:, 0, 2, None, None]
    )
    grid_y = (
        base_x * theta[:, 1, 0, None, None] + base_y * theta[:, 1, 1, None, None] + theta[:, 1, 2, None, None]
    )
    # grid_sample's unnormalize (align_corners=False): (g + 1) * size/2 - 0.5, then bilinear.
    ix = (grid_x + 1) * wp.astype(jnp.float32) - 0.5
    iy = (grid_y + 1) * hp.astype(jnp.float32) - 0.5
    x_w, y_n = jnp.floor(ix), jnp.floor(iy)
    fx, fy = ix - x_w, iy - y_n
    ex, sy = 1 - fx, 1 - fy
    weights = (sy * ex, sy * fx, fy * ex, fy * fx)  # nw, ne, sw, se
    x0, y0 = x_w.astype(jnp.int32), y_n.astype(jnp.int32)
    a, b = 2 * (w - 1 - mx0), 2 * (h - 1 - my0)  # the window's origin in the upsampled canvas

    def tap(img: jax.Array, yy: jax.Array, xx: jax.Array) -> jax.Array:
        valid = (xx >= 0) & (xx < 2 * wp) & (yy >= 0) & (yy < 2 * hp)
        r = jnp.clip(yy + b, 0, img.shape[0] - 1)
        q = jnp.clip(xx + a, 0, img.shape[1] - 1)
        return jnp.where(valid[..., None], img[r, q], jnp.zeros((), img.dtype))

    def sample(img, x0, y0, nw, ne, sw, se):
        out = nw[..., None] * tap(img, y0, x0)
        out = out + ne[..., None] * tap(img, y0, x0 + 1)
        out = out + sw[..., None] * tap(img, y0 + 1, x0)
        return out + se[..., None] * tap(img, y0 + 1, x0 + 1)

    warped = jax.vmap(sample)(up, x0, y0, *weights)

    # Downsample and crop.
    out = _downsample(_downsample(warped, 2), 1)
    chex.assert_shape(out, (n, h, w, c))
    return out
