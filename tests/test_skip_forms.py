"""The two forms of a skipped (non-finite) update in ``make_step``: the conditional the CPU runs
and the per-leaf select accelerators run (``skip_by_select``: a conditional makes a TPU keep a
copy of the whole state). Both give the same state, bit for bit: a finite batch updates, a
non-finite one leaves the parameters and the optimizer state as they were and is flagged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.averaging.ema import EMASpec
from dew.inputs import Field, InputSpec
from dew.training import steps
from dew.training.objective import Aux, Objective


class Quadratic(Objective):
    """loss = mean((w·x − y)²) over a [n, 3] batch; params {"w": [3]}."""

    input_spec = InputSpec(Field("x", (3,)))

    def init(self, rng, batch):
        return {"w": jax.random.normal(rng, (3,))}

    def project(self, params):
        return params

    def loss(self, params, rng, batch, step):
        residual = batch["x"] @ params["w"] - batch["y"]
        return jnp.mean(residual**2), ({}, Aux())


def run(select: bool, batches):
    steps.TRACED_FOR = "tpu" if select else "cpu"
    try:
        objective, optimizer, ema = Quadratic(), optax.adam(1e-2), EMASpec(0.9)
        state = steps.make_init(objective, optimizer, ema)(jax.random.key(0), batches[0])
        step = jax.jit(steps.make_step(objective, optimizer, ema))
        history = []
        for batch in batches:
            state, stats = step(state, batch)
            history.append((jax.device_get(state), int(stats["skipped_updates"])))
        return history
    finally:
        steps.TRACED_FOR = None


@pytest.fixture
def batches():
    rng = np.random.default_rng(0)

    def make() -> dict:
        return {"x": rng.normal(size=(8, 3)).astype(np.float32), "y": rng.normal(size=8).astype(np.float32)}

    out = [make(), make(), make()]
    out[1]["y"][2] = np.nan  # the second batch's loss is not finite
    return out


def test_select_and_conditional_give_the_same_states_and_skip_the_same_update(batches):
    by_select, by_conditional = run(True, batches), run(False, batches)
    assert [flag for _, flag in by_select] == [0, 1, 0] == [flag for _, flag in by_conditional]
    for (a, _), (b, _) in zip(by_select, by_conditional, strict=True):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # the skipped step left the parameters and Adam's moments as the first step made them
    first, skipped = by_select[0][0], by_select[1][0]
    np.testing.assert_array_equal(first.params["w"], skipped.params["w"])
    for x, y in zip(jax.tree.leaves(first.opt_state), jax.tree.leaves(skipped.opt_state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(by_select[2][0].params["w"], skipped.params["w"])


def test_the_form_follows_the_backend_unless_forced(monkeypatch):
    assert steps.skip_by_select() is (jax.default_backend() != "cpu")
    monkeypatch.setattr(steps, "TRACED_FOR", "tpu")
    assert steps.skip_by_select() is True
    monkeypatch.setattr(steps, "TRACED_FOR", "cpu")
    assert steps.skip_by_select() is False


def test_the_stop_policys_step_applies_every_update_and_still_flags_it(batches):
    """skip_nonfinite=False: finite batches update exactly as the skipping step does, and the
    non-finite one is applied (its NaN reaches the parameters) and flagged for the guard."""
    objective, optimizer, ema = Quadratic(), optax.adam(1e-2), EMASpec(0.9)
    state = steps.make_init(objective, optimizer, ema)(jax.random.key(0), batches[0])
    applying = jax.jit(steps.make_step(objective, optimizer, ema, skip_nonfinite=False))
    skipping = jax.jit(steps.make_step(objective, optimizer, ema))
    after_applying, stats = applying(state, batches[0])
    after_skipping, _ = skipping(state, batches[0])
    assert int(stats["skipped_updates"]) == 0
    for x, y in zip(jax.tree.leaves(after_applying), jax.tree.leaves(after_skipping), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    after_bad, stats = applying(after_applying, batches[1])
    assert int(stats["skipped_updates"]) == 1
    assert np.isnan(np.asarray(after_bad.params["w"])).all()
