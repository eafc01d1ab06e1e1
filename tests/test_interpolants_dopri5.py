"""The adaptive Dormand–Prince solver on fields with known solutions: its tolerance, reversed
time, jit, and the step cap on a field it cannot integrate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.sampling.dopri5 import odeint


def test_linear_field_meets_its_tolerance_forward_and_reversed():
    """y' = λ y: a 5th-order method with local error control keeps the global error within a
    few tolerances over the run (each accepted step's error <= atol + rtol |y|)."""
    lam = jnp.asarray([-2.0, 0.5, 1.5])
    ts = np.linspace(0.0, 1.0, 6, dtype=np.float32)
    y0 = jnp.ones(3)
    ys, stats = jax.jit(lambda y: odeint(lambda t, y: lam * y, y, ts, rtol=1e-5, atol=1e-7))(y0)
    exact = np.exp(np.outer(ts, np.asarray(lam)))
    steps = int(stats.accepted + stats.rejected)
    np.testing.assert_allclose(ys, exact, rtol=steps * 1e-5 + 1e-6)
    assert int(stats.nfe) == 2 + 6 * steps and int(stats.accepted) >= 1
    back, _ = odeint(lambda t, y: lam * y, ys[-1], ts[::-1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(back[-1], y0, rtol=2 * steps * 1e-5 + 1e-6)


def test_time_dependent_field_and_the_first_output_is_y0():
    """y' = cos(t) y: y = exp(sin t)."""
    ts = np.asarray([0.0, 0.3, 2.0], np.float32)
    ys, _ = odeint(lambda t, y: jnp.cos(t) * y, jnp.full((2, 2), 0.5), ts, rtol=1e-6, atol=1e-8)
    assert np.all(np.asarray(ys[0]) == 0.5)
    np.testing.assert_allclose(ys[:, 0, 0], 0.5 * np.exp(np.sin(ts)), rtol=1e-4)


def test_a_field_it_cannot_integrate_stops_at_the_step_cap():
    ys, stats = odeint(
        lambda t, y: jnp.full_like(y, jnp.nan), jnp.ones(2), np.asarray([0.0, 1.0]), max_steps=7
    )
    assert int(stats.accepted + stats.rejected) == 7 and np.all(np.isnan(np.asarray(ys[1])))


def test_bad_times_are_refused():
    with pytest.raises(ValueError, match="strictly monotonic"):
        odeint(lambda t, y: y, jnp.ones(1), np.asarray([0.0, 1.0, 0.5]))
    with pytest.raises(ValueError, match="1-D array of >= 2 times"):
        odeint(lambda t, y: y, jnp.ones(1), np.asarray([0.0]))
