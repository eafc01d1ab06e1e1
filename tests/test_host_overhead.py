"""The loop's host work: statistics summed on the device and read once per window, the
non-finite check one scalar per check, the step's guard one branch on one flag."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.training import loop as loop_lib
from dew.training.calls import MultiStep
from dew.training.loop import Stage, fit
from dew.training.metrics import DeviceSums
from dew.training.nonfinite import NonFiniteError, NonFiniteGuard
from dew.training.state import TrainState
from dew.training.steps import global_norm


@pytest.mark.parametrize("chunk", [1, 4, 32])
def test_device_sums_are_the_exact_window_sums(chunk):
    sums = DeviceSums(chunk=chunk)
    rng = np.random.default_rng(0)
    for window in (10, 3, 33):  # partial chunks, a window shorter and one longer than a chunk
        losses = rng.standard_normal(window).astype(np.float32)
        flags = rng.integers(0, 2, window).astype(np.int32)
        for loss, flag in zip(losses, flags, strict=True):
            sums.add({"loss": jnp.asarray(loss), "skipped_updates": jnp.asarray(flag)})
        got, count = sums.read()
        assert count == window
        # float32 summands accumulated in float32: the error bound is window * eps * sum |x|.
        bound = window * np.finfo(np.float32).eps * np.abs(losses).sum()
        assert abs(got["loss"] - losses.astype(np.float64).sum()) <= bound
        assert got["skipped_updates"] == flags.sum() and got["skipped_updates"].dtype == np.int64


def test_device_sums_means_average_statistics_and_sum_counts():
    sums = DeviceSums(chunk=4)
    for i in range(6):
        sums.add({"loss": jnp.float32(i), "skipped_updates": jnp.int32(i % 2)})
    means, count = sums.means(frozenset({"skipped_updates"}))
    assert count == 6 and means == {"loss": 2.5, "skipped_updates": 3.0}
    assert sums.means() == ({}, 0)


def toy_step(nan_at: int | None = None):
    """y = w x regression; the loss is NaN at step ``nan_at`` (1-based)."""

    def step(state: TrainState, batch):
        loss = jnp.mean((state.params["w"] * batch["x"] - 2.0 * batch["x"]) ** 2)
        if nan_at is not None:
            loss = jnp.where(state.step + 1 == nan_at, jnp.nan, loss)
        flag = (~jnp.isfinite(loss)).astype(jnp.int32)
        grad = 2.0 * (state.params["w"] - 2.0)  # d loss / d w at x = 1: converges to w = 2
        params = {"w": state.params["w"] - 0.1 * jnp.where(flag, 0.0, grad)}
        new = state.replace(step=state.step + 1, params=params)
        return new, {"loss": loss, "grad_norm": jnp.abs(loss), "skipped_updates": flag}

    return jax.jit(step)


def toy_state() -> TrainState:
    zero = {"w": jnp.zeros(())}
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=zero, opt_state=(), ema=zero, rng=jnp.zeros(2, jnp.uint32)
    )


def batches():
    while True:
        yield {"x": np.ones(4, np.float32)}


class Every(Stage):
    def __init__(self, every: int):
        self.every, self.runs = every, []

    def run(self, ctx):
        self.runs.append(ctx.step)


def test_fit_reads_one_scalar_per_check_not_one_per_step(monkeypatch):
    calls = []
    real = jax.device_get
    monkeypatch.setattr(loop_lib.jax, "device_get", lambda x: calls.append(x) or real(x))
    stage = Every(25)
    state = fit(toy_state(), toy_step(), batches(), 100, [stage])
    assert int(state.step) == 100 and stage.runs == [25, 50, 75, 100]
    # The starting step, then one read of the summed flags per due stage: 5, not 100.
    assert len(calls) == 5


@pytest.mark.parametrize("every", [7, 1000])
def test_the_first_non_finite_step_is_named_whatever_the_window(every):
    with pytest.raises(NonFiniteError, match="non-finite loss \\(nan\\) at step 12"):
        fit(toy_state(), toy_step(nan_at=12), batches(), 30, [Every(every)])


@pytest.mark.parametrize("laid_end_to_end", [None, True, False])
def test_global_norm_is_the_norm_of_all_leaves_and_flags_any_non_finite_leaf(laid_end_to_end):
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(4, jnp.bfloat16)}
    expected = np.sqrt(np.sum(np.arange(6.0) ** 2) + 4.0)
    norm = functools.partial(global_norm, laid_end_to_end=laid_end_to_end)
    # float32 sums of 10 exact terms: exact, so any order of the additions gives the same norm
    np.testing.assert_allclose(norm(tree), expected, rtol=1e-6)
    np.testing.assert_allclose(norm(tree), optax.tree.norm(tree), rtol=1e-6)
    for bad in (jnp.nan, jnp.inf):
        assert not np.isfinite(norm({**tree, "b": tree["b"].at[2].set(bad)}))
    # the per-leaf form (an accelerator's) never builds the concatenated copy of the gradients
    program = str(jax.make_jaxpr(norm)(tree))
    assert ("concatenate" in program) == (laid_end_to_end is not False)


# --- several steps per call -----------------------------------------------------------------------
def test_device_sums_take_stacked_calls_between_single_steps():
    sums = DeviceSums(chunk=3)
    rng = np.random.default_rng(1)
    losses = rng.standard_normal(27).astype(np.float32)
    sizes, i = [1, 4, 4, 1, 1, 4, 4, 4, 1, 1, 1, 1], 0  # chunks of both kinds, full and partial
    for n in sizes:
        part = losses[i : i + n]
        sums.add({"loss": jnp.asarray(part if n > 1 else part[0])}, stacked=n > 1)
        i += n
    got, count = sums.read()
    assert count == len(losses) == i
    bound = len(losses) * np.finfo(np.float32).eps * np.abs(losses).sum()  # float32 accumulation
    assert abs(got["loss"] - losses.astype(np.float64).sum()) <= bound


class Calls(Stage):
    """Due every ``every`` steps; records the step count of every call it observes."""

    def __init__(self, every: int):
        self.every, self.runs, self.calls = every, [], []

    def observe(self, ctx):
        self.calls.append((ctx.step, ctx.steps))

    def run(self, ctx):
        self.runs.append(ctx.step)


def test_several_steps_per_call_give_the_single_steps_states_and_end_on_every_cadence():
    single = fit(toy_state(), toy_step(), batches(), 45, [Calls(10)])
    stage, other = Calls(10), Every(15)
    multi = fit(toy_state(), MultiStep(toy_step(), 4), batches(), 45, [stage, other])
    assert jax.tree.map(np.array_equal, single, multi) == jax.tree.map(lambda _: True, single)
    assert stage.runs == [10, 20, 30, 40, 45] and other.runs == [15, 30, 45]
    # Calls of 4 wherever no cadence (10, 15, 20, ...) or the end falls strictly inside one;
    # single steps up to such a point.
    ends = [end for end, _ in stage.calls]
    assert ends == [4, 8, 9, 10, 14, 15, 19, 20, 24, 28, 29, 30, 34, 38, 39, 40, 44, 45]
    assert [n for _, n in stage.calls] == [b - a for a, b in zip([0, *ends], ends, strict=False)]


@pytest.mark.parametrize("every", [7, 1000])
def test_the_first_non_finite_step_inside_a_multi_step_call_is_named(every):
    # Step 12 is the fourth step of the call 9..12 (every=1000) or a single step (every=7).
    with pytest.raises(NonFiniteError, match="non-finite loss \\(nan\\) at step 12"):
        fit(toy_state(), MultiStep(toy_step(nan_at=12), 4), batches(), 30, [Every(every)])


def test_the_skip_brake_counts_the_steps_of_multi_step_calls():
    def nan_from(first: int):
        def step(state, batch):
            loss = jnp.where(state.step + 1 >= first, jnp.nan, jnp.mean(batch["x"]))
            flag = (~jnp.isfinite(loss)).astype(jnp.int32)
            return state.replace(step=state.step + 1), {"loss": loss, "skipped_updates": flag}

        return jax.jit(step)

    messages = []
    for k in (1, 4):
        with pytest.raises(NonFiniteError) as caught:
            guard = NonFiniteGuard("skip", max_skipped=0.5, window=8)
            fit(toy_state(), MultiStep(nan_from(3), k), batches(), 40, [], guard=guard)
        messages.append(str(caught.value))
    # Steps 3..8 of the first window of 8 are skipped: 6 > 4, stop at step 8, naming it.
    assert messages[0] == messages[1]
    assert "at step 8" in messages[1] and "dropped 6 of the last 8 updates" in messages[1]
