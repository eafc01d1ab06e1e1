"""Checkpoints on real orbax directories: retention, the four items, positions, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.training.checkpoints import (
    CheckpointRestorationError,
    Checkpoints,
    read_run_metadata,
    save_run_metadata,
)
from dew.training.state import TrainState

OPTIMIZER = optax.adam(1e-3)


def state_at(step: int) -> TrainState:
    params = {"w": jnp.full((3, 4), float(step)), "b": jnp.arange(4.0) + step}
    return TrainState(
        step=jnp.int32(step),
        params=params,
        opt_state=OPTIMIZER.init(params),
        ema=jax.tree.map(lambda x: 0.5 * x, params),
        rng=jax.random.PRNGKey(step),
    )


TEMPLATE = jax.eval_shape(lambda: state_at(0))


def test_keeps_the_latest_steps_plus_the_best_and_metricless_saves_never_become_best(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "checkpoints"), keep=2)
    for step, loss in [(1, 0.3), (2, 0.9), (3, None), (4, 0.8), (5, None)]:
        checkpoints.save(step, state_at(step), None, None if loss is None else {"loss": loss})
    checkpoints.wait()
    assert checkpoints.all_steps() == [1, 4, 5]
    assert checkpoints.latest == 5  # the best is old, latest does not go backwards
    assert checkpoints.best == 1
    reopened = Checkpoints(str(tmp_path / "checkpoints"), keep=2)
    assert (reopened.latest, reopened.best) == (5, 1)


def test_no_metrics_anywhere_means_no_best(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"), keep=3)
    checkpoints.save(1, state_at(1), None)
    checkpoints.wait()
    assert checkpoints.best is None and checkpoints.latest == 1


def test_restore_with_a_template_returns_the_saved_state_and_position(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(7, state_at(7), b'{"batch": 3, "epoch": 1}', {"loss": 1.0})
    state, position = checkpoints.restore(TEMPLATE)
    assert position == b'{"batch": 3, "epoch": 1}'
    assert int(state.step) == 7
    jax.tree.map(np.testing.assert_array_equal, state.params, state_at(7).params)
    jax.tree.map(np.testing.assert_array_equal, state.opt_state, state_at(7).opt_state)
    np.testing.assert_array_equal(state.rng, state_at(7).rng)
    assert isinstance(state.params["w"], jax.Array)


def test_restore_without_template_gives_host_arrays_and_ema_restores_debiased(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(2, state_at(2), None)
    state, position = checkpoints.restore(None)
    assert position is None
    assert isinstance(state.params["w"], np.ndarray)
    ema = checkpoints.restore_ema(TEMPLATE.params, decay=0.9)
    np.testing.assert_allclose(ema["w"], 0.5 * 2.0 / (1 - 0.9**2), rtol=1e-6)


def test_restoring_what_is_not_there_is_a_named_error(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    with pytest.raises(CheckpointRestorationError, match="no checkpoint in"):
        checkpoints.restore(TEMPLATE)
    checkpoints.save(1, state_at(1), None)
    with pytest.raises(
        CheckpointRestorationError, match=r"no checkpoint for step 9 .* stored steps are \[1\]"
    ):
        checkpoints.restore(TEMPLATE, step=9)


def test_a_step_that_disagrees_with_the_state_is_refused(tmp_path):
    with pytest.raises(ValueError, match="step 4 but the state is at step 3"):
        Checkpoints(str(tmp_path / "c")).save(4, state_at(3), None)


def test_run_metadata_is_plain_json_beside_checkpoints(tmp_path):
    assert read_run_metadata(str(tmp_path)) is None
    save_run_metadata(str(tmp_path), {"label": "edm", "config": {"seed": 0}})
    assert read_run_metadata(str(tmp_path)) == {"label": "edm", "config": {"seed": 0}}
