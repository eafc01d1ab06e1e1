"""Batched homogeneous transforms, as NVlabs/edm ``training/augment.py`` builds them
(``matrix``, ``translate2d``, ``scale2d``, ``rotate2d``, their ``_inv``, and the 3-D colour ones).

Every function takes per-example values of shape [N] (or Python scalars) and returns [N, 3, 3]
(2-D) or [N, 4, 4] (3-D) float32 matrices. ``compose`` multiplies them elementwise-and-sum in
float32, never through a matrix unit that may round to TF32 on an accelerator.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

Scalar = jax.Array | float


def matrix(rows: Sequence[Sequence[Scalar]], n: int) -> jax.Array:
    """[n, R, C] from rows of per-example [n] arrays and constants (the reference's ``matrix``)."""
    elems = [[jnp.broadcast_to(jnp.asarray(x, jnp.float32), (n,)) for x in row] for row in rows]
    return jnp.stack([jnp.stack(row, axis=-1) for row in elems], axis=-2)


def compose(*matrices: jax.Array) -> jax.Array:
    """``a @ b @ c ...`` evaluated left to right, as the reference's chained ``@`` is, in float32."""
    out = matrices[0]
    for m in matrices[1:]:
        out = jnp.sum(out[..., :, :, None] * m[..., None, :, :], axis=-2)
    return out


def translate2d(tx: Scalar, ty: Scalar, n: int) -> jax.Array:
    return matrix([[1, 0, tx], [0, 1, ty], [0, 0, 1]], n)


def scale2d(sx: Scalar, sy: Scalar, n: int) -> jax.Array:
    return matrix([[sx, 0, 0], [0, sy, 0], [0, 0, 1]], n)


def rotate2d(theta: jax.Array, n: int) -> jax.Array:
    return matrix([[jnp.cos(theta), jnp.sin(-theta), 0], [jnp.sin(theta), jnp.cos(theta), 0], [0, 0, 1]], n)


def translate2d_inv(tx: Scalar, ty: Scalar, n: int) -> jax.Array:
    return translate2d(-tx, -ty, n)


def scale2d_inv(sx: Scalar, sy: Scalar, n: int) -> jax.Array:
    return scale2d(1 / sx, 1 / sy, n)


def rotate2d_inv(theta: jax.Array, n: int) -> jax.Array:
    return rotate2d(-theta, n)


def translate3d(tx: Scalar, ty: Scalar, tz: Scalar, n: int) -> jax.Array:
    return matrix([[1, 0, 0, tx], [0, 1, 0, ty], [0, 0, 1, tz], [0, 0, 0, 1]], n)


def scale3d(sx: Scalar, sy: Scalar, sz: Scalar, n: int) -> jax.Array:
    return matrix([[sx, 0, 0, 0], [0, sy, 0, 0], [0, 0, sz, 0], [0, 0, 0, 1]], n)


def rotate3d(v: Sequence[float], theta: jax.Array, n: int) -> jax.Array:
    """Rotation by ``theta`` about the unit axis ``v`` (Rodrigues), the reference's ``rotate3d``."""
    vx, vy, vz = (jnp.float32(c) for c in v[:3])
    s, c = jnp.sin(theta), jnp.cos(theta)
    cc = 1 - c
    return matrix(
        [
            [vx * vx * cc + c, vx * vy * cc - vz * s, vx * vz * cc + vy * s, 0],
            [vy * vx * cc + vz * s, vy * vy * cc + c, vy * vz * cc - vx * s, 0],
            [vz * vx * cc - vy * s, vz * vy * cc + vx * s, vz * vz * cc + c, 0],
            [0, 0, 0, 1],
        ],
        n,
    )
