"""The adaptive Dormand–Prince solver on fields with known solutions: its tolerance, reversed
time, jit, and the step cap on a field it cannot integrate; its step sizes against torchdiffeq's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import ROOT

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


def _step_sizes(times: np.ndarray) -> np.ndarray:
    """Each attempted step's size from its evaluation times: after the 2 of the first-step
    selection, 6 per step, the first at t0 and the second at t0 + dt/5."""
    stages = np.asarray(times[2:], np.float64)
    n = len(stages) // 6
    return (stages[1 : 6 * n : 6] - stages[0 : 6 * n : 6]) / 0.2


def test_step_sizes_follow_torchdiffeqs_as_the_docstring_states():
    """torchdiffeq's own dopri5 on a nonlinear field (third_party/sit/make_dopri5_steps.py):
    the same 146 evaluations (so the same accept/reject sequence), step sizes within 1e-3
    relative (measured: median 5e-6, max 2e-4; the error ratio is a cancelling difference of
    stage sums, so they do not agree to float32 roundoff, as ``dew.sampling.dopri5`` says; the
    float32 times this is read from resolve 1e-4 of the smallest step), the end state within
    the solver's tolerance."""
    golden = np.load(ROOT / "third_party" / "sit" / "dopri5_steps.npz", allow_pickle=False)
    w = jnp.asarray(golden["w"])
    times: list[float] = []

    def field(t, y):
        jax.debug.callback(lambda v: times.append(float(v)), t, ordered=True)
        return jnp.tanh(y @ w) * (1 + t) - 30.0 * y * (1 + jnp.sin(8 * t))

    span = np.asarray([0.0, 1.0], np.float32)
    ys, stats = odeint(field, jnp.asarray(golden["y0"]), span, rtol=1e-3, atol=1e-6)
    jax.effects_barrier()
    want = golden["times"]
    assert len(times) == int(stats.nfe) == len(want) == 146
    got_steps, want_steps = _step_sizes(np.asarray(times)), _step_sizes(want)
    relative = np.abs(got_steps - want_steps) / want_steps
    assert relative.max() <= 1e-3, relative.max()
    assert np.abs(np.asarray(ys[-1]) - golden["y1"]).max() <= 1e-6
