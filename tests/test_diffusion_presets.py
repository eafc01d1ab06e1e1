"""Prediction targets, their closed-form conversions, and the Table 1 presets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew
from dew.diffusion import EDM, FLOW, VE, VP, Process, schedules, targets

SIGMAS = jnp.array([0.01, 0.3, 1.0, 7.0, 80.0])


@pytest.fixture(scope="module")
def pair():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    y = jax.random.normal(k1, (5, 3))
    n = jax.random.normal(k2, (5, 3))
    return y, n, y + SIGMAS[:, None] * n


@pytest.mark.parametrize("target", targets.TARGETS)
def test_each_targets_definition_denoises_to_the_clean_sample(pair, target):
    y, n, x = pair
    truth = targets.ground_truth(target, y, n, SIGMAS)
    np.testing.assert_allclose(targets.to_denoised(target, truth, x, SIGMAS), y, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(targets.from_denoised(target, y, x, SIGMAS), truth, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("source", targets.TARGETS)
@pytest.mark.parametrize("target", targets.TARGETS)
def test_conversions_between_targets_are_exact(pair, source, target):
    y, n, x = pair
    got = targets.convert(targets.ground_truth(source, y, n, SIGMAS), source, target, x, SIGMAS)
    np.testing.assert_allclose(got, targets.ground_truth(target, y, n, SIGMAS), atol=3e-4, rtol=1e-4)


def test_the_closed_forms_of_the_targets(pair):
    y, n, x = pair
    s = SIGMAS[:, None]
    v = targets.ground_truth("v", y, n, SIGMAS)
    # flow: x_t = (1−t) y + t n with t = σ/(1+σ) is x/(1+σ); and y = x_t − t u.
    t = s / (1 + s)
    u = targets.ground_truth("flow", y, n, SIGMAS)
    np.testing.assert_allclose(x / (1 + s) - t * u, y, atol=2e-5)
    # EDM's F with σ_data = 1 is −v.
    np.testing.assert_allclose(
        targets.ground_truth("edm", y, n, SIGMAS, sigma_data=1.0), -v, rtol=1e-4, atol=1e-4
    )


def test_v_target_matches_table_1_vp_frame_in_float64():
    """v = α_t ε − σ_t y (Salimans & Ho 2022) in VP's own frame, built from EDM Table 1's VP
    column in float64: σ(t) = √(exp(½β_d t² + β_min t) − 1), s(t) = 1/√(exp(½β_d t² + β_min t)),
    so x_vp = s(t)·x = α_t y + σ_t ε with α_t = s(t), σ_t = s(t)·σ(t)."""
    beta_d, beta_min = 19.9, 0.1
    t = np.array([1e-3, 0.05, 0.2, 0.5, 0.9, 1.0])
    growth = np.exp(0.5 * beta_d * t**2 + beta_min * t)
    sigma, scale = np.sqrt(growth - 1.0), 1.0 / np.sqrt(growth)
    alpha_t, sigma_t = scale, scale * sigma
    np.testing.assert_allclose(alpha_t**2 + sigma_t**2, 1.0, rtol=1e-12)  # a VP frame
    rng = np.random.default_rng(0)
    y, eps = rng.standard_normal((2, len(t), 3))
    reference = alpha_t[:, None] * eps - sigma_t[:, None] * y  # float64
    got = np.asarray(
        targets.ground_truth(
            "v", jnp.asarray(y, jnp.float32), jnp.asarray(eps, jnp.float32), jnp.asarray(sigma, jnp.float32)
        ),
        np.float64,
    )
    # float32 inputs and ~6 float32 operations, each within half an ulp (2^-24 relative) of
    # terms no larger than |y| + |ε|: 8 ulps of that magnitude bound the difference.
    bound = 8 * 2.0**-24 * (np.abs(y) + np.abs(eps))
    assert np.all(np.abs(got - reference) <= bound), np.max(np.abs(got - reference) / bound)
    # and D = c_skip x + c_out v recovers y (Table 1 with the v-target's c_skip, c_out), in float64
    x = y + sigma[:, None] * eps
    c_skip, c_out = 1 / (1 + sigma**2), -sigma / np.sqrt(1 + sigma**2)
    np.testing.assert_allclose(c_skip[:, None] * x + c_out[:, None] * reference, y, rtol=0, atol=1e-12)


def test_presets_follow_table_1():
    sigma = jnp.array([0.05, 1.0, 20.0])
    # VP: c_skip 1, c_out −σ, c_in 1/√(σ²+1), c_noise (M−1) σ⁻¹(σ), λ 1/σ².
    np.testing.assert_allclose(VP.c_skip(sigma), 1.0)
    np.testing.assert_allclose(VP.c_out(sigma), -sigma)
    np.testing.assert_allclose(VP.c_in(sigma), 1 / np.sqrt(sigma**2 + 1), rtol=1e-6)
    np.testing.assert_allclose(VP.loss_weight(sigma), 1 / sigma**2, rtol=1e-6)
    t = schedules.vp_time(sigma)
    np.testing.assert_allclose(schedules.vp_sigma(t), sigma, rtol=1e-4)
    np.testing.assert_allclose(VP.c_noise(sigma), 999 * t, rtol=1e-6)
    assert float(VP.sigmas(10)[0]) == pytest.approx(VP.sigma_max, rel=1e-5)
    assert float(VP.sigmas(10)[-1]) == pytest.approx(VP.sigma_min, rel=1e-3)
    # VE: c_skip 1, |c_out| σ, c_in 1, c_noise ln(σ/2), geometric σ, log-uniform training σ.
    np.testing.assert_allclose(VE.c_in(sigma), 1.0)
    np.testing.assert_allclose(jnp.abs(VE.c_out(sigma)), sigma)
    np.testing.assert_allclose(VE.c_noise(sigma), np.log(sigma / 2), rtol=1e-6)
    np.testing.assert_allclose(np.diff(np.log(np.asarray(VE.sigmas(6)))), np.log(0.02 / 100) / 5, rtol=1e-4)
    log_train = np.log(np.asarray(VE.sample_training_sigma(jax.random.PRNGKey(0), 100_000)))
    assert log_train.min() >= np.log(0.02) - 1e-5 and log_train.max() <= np.log(100) + 1e-5
    assert log_train.mean() == pytest.approx((np.log(0.02) + np.log(100)) / 2, abs=0.03)
    # EDM: λ = (σ² + σ_d²)/(σ σ_d)², the seed's formula.
    np.testing.assert_allclose(EDM.loss_weight(sigma), (sigma**2 + 0.25) / (0.5 * sigma) ** 2, rtol=1e-6)
    # Flow: λ = 1/t², t logit-normal ⇔ σ lognormal(0, 1), equal steps in t.
    t_flow = sigma / (1 + sigma)
    np.testing.assert_allclose(FLOW.loss_weight(sigma), 1 / t_flow**2, rtol=1e-5)
    ts = np.asarray(FLOW.sigmas(5)) / (1 + np.asarray(FLOW.sigmas(5)))
    np.testing.assert_allclose(np.diff(ts), np.diff(ts)[0], rtol=1e-4)


def test_presets_are_registered_by_name():
    assert dew.presets.EDM is EDM
    assert dew.presets["VP"] is VP and dew.presets["VE"] is VE
    assert dew.presets["RectifiedFlow"] is FLOW is dew.presets["FlowMatching"]


def test_unknown_process_choices_name_the_field():
    with pytest.raises(ValueError, match=r"Process.target='score' is unknown: expected one of"):
        Process(target="score")
    with pytest.raises(ValueError, match=r"Process\.schedule"):
        Process(schedule="cosine")


@pytest.mark.parametrize("preset", [EDM, VP, VE, FLOW], ids=["EDM", "VP", "VE", "flow"])
def test_every_preset_denoises_exactly_with_the_ideal_network(preset):
    """A network that outputs each preset's own target (computed from the truth) makes D = y."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    y = jax.random.normal(k1, (4, 2, 2, 1))
    sigma = preset.sample_training_sigma(jax.random.PRNGKey(4), 4)
    n = jax.random.normal(k2, y.shape)
    x = y + sigma[:, None, None, None] * n
    ideal = targets.ground_truth(preset.target, y, n, sigma, preset.sigma_data)
    got = preset.denoise(lambda x_in, c_noise: ideal, x, sigma)
    np.testing.assert_allclose(got, y, atol=1e-4)
