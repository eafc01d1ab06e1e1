"""NVlabs/edm's ``AugmentPipe`` (``training/augment.py``) as a pure function of (key, images).

``augment(settings, key, images) -> (images, labels)`` is ``apply(settings, draw(settings, key,
n), images)``: ``draw`` makes every random number the reference's ``__call__`` makes, in its
order and shapes (``DRAWS``), from a JAX key; ``apply`` is the reference's arithmetic on them.
Parity tests feed ``apply`` the reference's own recorded draws. Everything is traced with
static shapes, so it runs inside the jitted step and shards with the batch; the same key gives
the same output, so a resumed run draws what an uninterrupted one would.

``labels`` [N, settings.label_dim] are the augmentation labels the reference returns (and its
networks take as ``augment_labels``), in its order. With ``p`` = 0 (off) the images come back
unchanged and the labels are [N, 0].
"""

from __future__ import annotations

from collections.abc import Mapping

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dew.augment import matrices as m
from dew.augment.resample import warp
from dew.augment.settings import COLOUR, GEOMETRIC, LABEL_WIDTH, AugmentSettings

Draws = Mapping[str, tuple[jax.Array, ...]]

# Per transform, the reference's random calls in order: ("randint", high) | ("rand",) | ("randn",)
# and their leading shape in units of the batch ("n" = [N], "2n" = [2, N], "1n" = [1, N]).
DRAWS: dict[str, tuple[tuple[str, int, str], ...]] = {
    "xflip": (("randint", 2, "n"), ("rand", 0, "n")),
    "yflip": (("randint", 2, "n"), ("rand", 0, "n")),
    "rotate_int": (("randint", 4, "n"), ("rand", 0, "n")),
    "translate_int": (("rand", 0, "2n"), ("rand", 0, "1n")),
    "scale": (("randn", 0, "n"), ("rand", 0, "n")),
    "rotate_frac": (("rand", 0, "n"), ("rand", 0, "n")),
    "aniso": (("randn", 0, "n"), ("rand", 0, "n"), ("rand", 0, "n"), ("rand", 0, "n")),
    "translate_frac": (("randn", 0, "2n"), ("rand", 0, "1n")),
    "brightness": (("randn", 0, "n"), ("rand", 0, "n")),
    "contrast": (("randn", 0, "n"), ("rand", 0, "n")),
    "lumaflip": (("randint", 2, "n"), ("rand", 0, "n")),
    "hue": (("rand", 0, "n"), ("rand", 0, "n")),
    "saturation": (("randn", 0, "n"), ("rand", 0, "n")),
}


def draw_shape(layout: str, n: int) -> tuple[int, ...]:
    return {"n": (n,), "2n": (2, n), "1n": (1, n)}[layout]


def draw(settings: AugmentSettings, key: jax.Array, n: int) -> dict[str, tuple[jax.Array, ...]]:
    """Every random number ``apply`` needs for a batch of ``n``: uniform [0, 1) float32 for
    ``rand``, standard normal float32 for ``randn``, int32 in [0, high) for ``randint``. Each
    transform draws from ``fold_in(key, its index in LABEL_WIDTH)``, so enabling one transform
    leaves the others' draws unchanged."""
    out: dict[str, tuple[jax.Array, ...]] = {}
    names = tuple(LABEL_WIDTH)
    for name in settings.transforms:
        spec = DRAWS[name]
        keys = jax.random.split(jax.random.fold_in(key, names.index(name)), len(spec))
        values = []
        for k, (kind, high, layout) in zip(keys, spec, strict=True):
            shape = draw_shape(layout, n)
            if kind == "randint":
                values.append(jax.random.randint(k, shape, 0, high, jnp.int32))
            elif kind == "rand":
                values.append(jax.random.uniform(k, shape, jnp.float32))
            else:
                values.append(jax.random.normal(k, shape, jnp.float32))
        out[name] = tuple(values)
    return out


def _gate(gate: jax.Array, threshold: float, value: jax.Array) -> jax.Array:
    """``torch.where(rand < threshold, value, zeros_like(value))``; ``threshold`` is a Python
    product (double) compared in float32 as torch compares a tensor with a Python scalar."""
    return jnp.where(gate < jnp.float32(threshold), value, jnp.zeros_like(value))


def _per_row(x: jax.Array) -> jax.Array:
    return x.reshape((-1, 1, 1, 1))


def apply(settings: AugmentSettings, draws: Draws, images: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The reference's ``AugmentPipe.__call__`` on [N, H, W, C] images with the given draws."""
    chex.assert_rank(images, 4)
    n, h, w, _ = images.shape
    s = settings
    labels: list[jax.Array] = []

    # Pixel blitting.
    if s.xflip > 0:
        bit, gate = draws["xflip"]
        k = _gate(gate, s.xflip * s.p, bit)
        images = jnp.where(_per_row(k) == 1, jnp.flip(images, 2), images)
        labels.append(k)
    if s.yflip > 0:
        bit, gate = draws["yflip"]
        k = _gate(gate, s.yflip * s.p, bit)
        images = jnp.where(_per_row(k) == 1, jnp.flip(images, 1), images)
        labels.append(k)
    if s.rotate_int > 0:
        quarter, gate = draws["rotate_int"]
        k = _per_row(_gate(gate, s.rotate_int * s.p, quarter))
        images = jnp.where((k == 1) | (k == 2), jnp.flip(images, 2), images)
        images = jnp.where((k == 2) | (k == 3), jnp.flip(images, 1), images)
        images = jnp.where((k == 1) | (k == 3), jnp.swapaxes(images, 1, 2), images)
        labels += [((k == 1) | (k == 2)).reshape(n), ((k == 2) | (k == 3)).reshape(n)]
    if s.translate_int > 0:
        u, gate = draws["translate_int"]
        shift = _gate(gate, s.translate_int * s.p, u * 2 - 1)
        tx = jnp.round(shift[0] * jnp.float32(w * s.translate_int_max)).astype(jnp.int32)
        ty = jnp.round(shift[1] * jnp.float32(h * s.translate_int_max)).astype(jnp.int32)
        x = jnp.arange(w)[None, :] - tx[:, None]
        y = jnp.arange(h)[None, :] + ty[:, None]
        x = w - 1 - jnp.abs(w - 1 - jnp.mod(x, w * 2 - 2))
        y = h - 1 - jnp.abs(h - 1 - jnp.mod(y, h * 2 - 2))
        images = jax.vmap(lambda img, yy, xx: img[yy[:, None], xx[None, :]])(images, y, x)
        labels += [tx / jnp.float32(w * s.translate_int_max), ty / jnp.float32(h * s.translate_int_max)]

    # Parameters of the geometric transformations.
    g_inv = jnp.broadcast_to(jnp.eye(3, dtype=jnp.float32), (n, 3, 3))
    if s.scale > 0:
        z, gate = draws["scale"]
        k = _gate(gate, s.scale * s.p, z)
        size = jnp.exp2(k * jnp.float32(s.scale_std))
        g_inv = m.compose(g_inv, m.scale2d_inv(size, size, n))
        labels.append(k)
    if s.rotate_frac > 0:
        u, gate = draws["rotate_frac"]
        k = _gate(gate, s.rotate_frac * s.p, (u * 2 - 1) * jnp.float32(np.pi * s.rotate_frac_max))
        g_inv = m.compose(g_inv, m.rotate2d_inv(-k, n))
        labels += [jnp.cos(k) - 1, jnp.sin(k)]
    if s.aniso > 0:
        z, u, gate, rotate_gate = draws["aniso"]
        r = (u * 2 - 1) * jnp.float32(np.pi)
        k = _gate(gate, s.aniso * s.p, z)
        r = _gate(rotate_gate, s.aniso_rotate_prob, r)
        size = jnp.exp2(k * jnp.float32(s.aniso_std))
        g_inv = m.compose(
            g_inv, m.rotate2d_inv(r, n), m.scale2d_inv(size, 1 / size, n), m.rotate2d_inv(-r, n)
        )
        labels += [k * jnp.cos(r), k * jnp.sin(r)]
    if s.translate_frac > 0:
        z, gate = draws["translate_frac"]
        k = _gate(gate, s.translate_frac * s.p, z)
        tx = k[0] * jnp.float32(w * s.translate_frac_std)
        ty = k[1] * jnp.float32(h * s.translate_frac_std)
        g_inv = m.compose(g_inv, m.translate2d_inv(tx, ty, n))
        labels += [k[0], k[1]]
    if any(getattr(s, name) > 0 for name in GEOMETRIC):
        images = warp(images, g_inv)

    # Colour transformations.
    if any(getattr(s, name) > 0 for name in COLOUR):
        images, colour_labels = _colour(s, draws, images)
        labels += colour_labels

    out = jnp.concatenate([x.astype(jnp.float32).reshape(n, -1) for x in labels], axis=1) if labels else None
    if out is None:
        out = jnp.zeros((n, 0), jnp.float32)
    chex.assert_shape(out, (n, s.label_dim))
    return images, out


def _colour(s: AugmentSettings, draws: Draws, images: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
    """The reference's colour matrix M (brightness, contrast, luma flip, hue, saturation),
    applied to RGB (or, for one channel, its mean over the RGB rows)."""
    n, h, w, c = images.shape
    labels: list[jax.Array] = []
    eye = jnp.broadcast_to(jnp.eye(4, dtype=jnp.float32), (n, 4, 4))
    mat = eye
    axis = (np.asarray([1, 1, 1, 0]) / np.sqrt(3)).astype(np.float32)
    luma = jnp.asarray(np.outer(axis, axis).astype(np.float32))  # luma_axis.ger(luma_axis)
    if s.brightness > 0:
        z, gate = draws["brightness"]
        k = _gate(gate, s.brightness * s.p, z)
        b = k * jnp.float32(s.brightness_std)
        mat = m.compose(m.translate3d(b, b, b, n), mat)
        labels.append(k)
    if s.contrast > 0:
        z, gate = draws["contrast"]
        k = _gate(gate, s.contrast * s.p, z)
        f = jnp.exp2(k * jnp.float32(s.contrast_std))
        mat = m.compose(m.scale3d(f, f, f, n), mat)
        labels.append(k)
    if s.lumaflip > 0:
        bit, gate = draws["lumaflip"]
        k = _gate(gate, s.lumaflip * s.p, bit)
        flip = jnp.eye(4, dtype=jnp.float32) - 2 * luma * k.astype(jnp.float32)[:, None, None]
        mat = m.compose(flip, mat)
        labels.append(k)
    if s.hue > 0:
        u, gate = draws["hue"]
        k = _gate(gate, s.hue * s.p, (u * 2 - 1) * jnp.float32(np.pi * s.hue_max))
        mat = m.compose(m.rotate3d(axis, k, n), mat)
        labels += [jnp.cos(k) - 1, jnp.sin(k)]
    if s.saturation > 0:
        z, gate = draws["saturation"]
        k = _gate(gate, s.saturation * s.p, z)
        f = jnp.exp2(k * jnp.float32(s.saturation_std))[:, None, None]
        mat = m.compose(luma + (jnp.eye(4, dtype=jnp.float32) - luma) * f, mat)
        labels.append(k)
    pixels = images.reshape(n, h * w, c)
    if c == 3:
        rgb = jnp.sum(mat[:, None, :3, :3] * pixels[:, :, None, :], axis=-1) + mat[:, None, :3, 3]
    elif c == 1:
        row = jnp.mean(mat[:, :3, :], axis=1)  # [N, 4]
        rgb = pixels * jnp.sum(row[:, :3], axis=1)[:, None, None] + row[:, None, 3:]
    else:
        raise ValueError(f"colour augmentation needs 3 (RGB) or 1 (L) channels, got {c}")
    return rgb.reshape(n, h, w, c), labels


def augment(settings: AugmentSettings, key: jax.Array, images: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(augmented images, augmentation labels [N, label_dim])``; with ``p`` = 0 the images
    unchanged (bit for bit) and labels [N, 0]. Pure and jittable; ``key`` is the only randomness."""
    if not settings.enabled:
        return images, jnp.zeros((images.shape[0], 0), jnp.float32)
    return apply(settings, draw(settings, key, images.shape[0]), images)
