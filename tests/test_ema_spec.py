"""EMASpec: half-life with EDM's ramp-up, debiasing by the product of the decays, the path
predicate, and evaluation on the debiased EMA."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers_common import device_batch, tiny_config
from helpers_trainer import Regression, regression_batches

from dew.averaging import ema
from dew.config import ConfigError
from dew.objectives.base import EMASpec
from dew.training.steps import make_eval, make_init, make_step
from dew.training.trainer import Trainer


def test_edm_half_life_with_ramp_up_debiases_to_an_exact_average():
    spec = EMASpec(half_life=20.0, ramp_up=0.5)
    betas = np.array([float(spec.decay_at(n)) for n in range(1, 121)])
    # β_n = 0.5^(1/min(H, r·n)): the first update keeps half^(2) of nothing, later ones span H.
    np.testing.assert_allclose(betas[0], 0.5 ** (1 / 0.5), rtol=1e-6)
    np.testing.assert_allclose(betas[79:], 0.5 ** (1 / 20.0), rtol=1e-6)
    np.testing.assert_allclose(
        [float(spec.retained(n)) for n in (1, 7, 40, 120)],
        [np.prod(betas[:n]) for n in (1, 7, 40, 120)],
        rtol=1e-4,
    )
    # Constant params: the debiased EMA is exactly those params at every step.
    params = {"w": jnp.array([1.5, -2.0])}
    average = ema.zeros_like(params)
    history = []
    for n in range(1, 31):
        current = {"w": params["w"] * n}  # a moving target: debias must weight it correctly
        history.append(current["w"])
        average = ema.update(average, current, spec, n)
    weights = np.array([(1 - betas[i]) * np.prod(betas[i + 1 : 30]) for i in range(30)])
    expected = (weights[:, None] * np.stack(history)).sum(0) / weights.sum()
    np.testing.assert_allclose(ema.debias(average, spec, 30)["w"], expected, rtol=1e-5)


def test_untracked_leaves_follow_the_live_params_and_a_predicate_matching_nothing_is_an_error():
    params = {"net": {"w": jnp.ones(3), "b": jnp.full(2, 5.0)}}
    spec = EMASpec(decay=0.5, tracks=lambda path: path.endswith("/w"))
    average = ema.zeros_like(params, spec)
    np.testing.assert_array_equal(average["net"]["b"], params["net"]["b"])
    moved = {"net": {"w": jnp.full(3, 3.0), "b": jnp.full(2, 7.0)}}
    average = ema.update(average, moved, spec, 1)
    read = ema.debias(average, spec, 1)
    np.testing.assert_allclose(read["net"]["w"], 3.0)  # debiased average of one value
    np.testing.assert_array_equal(read["net"]["b"], 7.0)  # untracked: the live value
    with pytest.raises(
        ValueError, match=r"EMASpec\.tracks matches none of the 2 parameter leaves \(net/b, net/w\)"
    ):
        EMASpec(tracks=lambda path: "conv" in path).check(params)
    with pytest.raises(ValueError, match="num_updates must be >= 1"):
        ema.debias(average, spec, 0)
    with pytest.raises(ValueError, match="ramp_up needs a half_life"):
        EMASpec(ramp_up=0.05)


def test_evaluation_reads_the_debiased_ema_not_the_live_params():
    objective, optimizer = Regression(), optax.adam(5e-2)
    spec = EMASpec(half_life=4.0, ramp_up=0.5)
    batches = regression_batches(16, 6)
    state = jax.jit(make_init(objective, optimizer, spec))(jax.random.PRNGKey(0), batches[0])
    step = jax.jit(make_step(objective, optimizer, spec))
    for batch in batches:
        state, _ = step(state, batch)
    rng = jax.random.PRNGKey(1)
    got = jax.jit(make_eval(objective, spec))(state, batches[0], rng)
    want = objective.evaluate(ema.debias(state.ema, spec, 6), rng, device_batch(batches[0]))
    live = objective.evaluate(state.params, rng, device_batch(batches[0]))
    np.testing.assert_allclose(float(got["loss"]), float(want["loss"]), rtol=1e-5)
    assert abs(float(got["loss"]) - float(live["loss"])) > 1e-6


def test_the_trainer_refuses_an_ema_predicate_matching_no_parameter(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.ema\.tracks='no_such_layer'.*matches none of the"):
        Trainer(tiny_config(**{"ema.tracks": "no_such_layer"}), str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"config\.ema\.ramp_up=0\.05 is invalid"):
        Trainer(tiny_config(**{"ema.half_life": 0.0, "ema.ramp_up": 0.05}), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
