"""One- and few-step sampling of an average-velocity model (MeanFlow, Geng et al. 2025).

A MeanFlow network predicts the average velocity u(z_t, r, t) over [r, t], so one step jumps
exactly from t to r: z_r = z_t − (t − r) u(z_t, t, h = t − r). A schedule 1 = t_0 > t_1 > … >
t_n = 0 gives n network evaluations; (1, 0) is the papers' 1-NFE sampler, (1, 0.5, 0) a 2-NFE one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

AverageVelocity = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
"""u(z, t, h) for fixed conditions: z [B, ...], t and h = t − r [B] -> u of z's shape."""


def check_schedule(schedule: Sequence[float], name: str = "schedule") -> tuple[float, ...]:
    """``schedule`` as a tuple of floats if it starts at 1, ends at 0 and strictly decreases;
    otherwise a ValueError naming ``name``, the value and what is accepted."""
    try:
        points = tuple(float(s) for s in schedule)
    except (TypeError, ValueError):
        points = ()
    ok = len(points) >= 2 and points[0] == 1.0 and points[-1] == 0.0
    ok = ok and all(a > b for a, b in itertools.pairwise(points))
    if not ok:
        raise ValueError(
            f"{name}={tuple(schedule) if isinstance(schedule, Sequence) else schedule!r} is invalid: "
            "expected t points strictly decreasing from 1.0 to 0.0, e.g. (1.0, 0.0) or (1.0, 0.5, 0.0)"
        )
    return points


def mean_flow_step(u: AverageVelocity, z: jax.Array, t: jax.Array | float, r: jax.Array | float) -> jax.Array:
    """z_r = z_t − (t − r) u(z_t, t, t − r), t and r scalars or per-row [B]."""
    b = z.shape[0]
    tb = jnp.broadcast_to(jnp.asarray(t, jnp.float32), (b,))
    rb = jnp.broadcast_to(jnp.asarray(r, jnp.float32), (b,))
    return z - (tb - rb).reshape((-1,) + (1,) * (z.ndim - 1)) * u(z, tb, tb - rb)


def sample_mean_flow(u: AverageVelocity, noise: jax.Array, schedule: Sequence[float]) -> jax.Array:
    """The sample reached from ``noise`` (z at t = 1) along ``schedule`` (checked:
    ``check_schedule``), one network evaluation per interval; pure and jittable."""
    points = jnp.asarray(check_schedule(schedule), jnp.float32)

    def body(i, z):
        return mean_flow_step(u, z, points[i], points[i + 1])

    return jax.lax.fori_loop(0, len(points) - 1, body, noise)


__all__ = ["AverageVelocity", "check_schedule", "mean_flow_step", "sample_mean_flow"]
