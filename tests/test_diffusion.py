"""EDM's equations, and the samplers against a denoiser whose answer is known in closed form.

For data x0 ~ N(0, s² I), the exact denoiser is D(x; σ) = x s² / (s² + σ²) and the probability
flow ODE maps N(0, (s² + σ_max²) I) to N(0, s² I); a good solver lands at variance s².
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.diffusion import EDM, Process
from dew.sampling import CFG, sample


def test_preconditioning_matches_table_1():
    sigma = jnp.array([0.002, 0.5, 80.0])
    sd = 0.5
    np.testing.assert_allclose(EDM.c_skip(sigma), sd**2 / (sigma**2 + sd**2), rtol=1e-6)
    np.testing.assert_allclose(EDM.c_out(sigma), sigma * sd / np.sqrt(sigma**2 + sd**2), rtol=1e-6)
    np.testing.assert_allclose(EDM.c_in(sigma), 1 / np.sqrt(sigma**2 + sd**2), rtol=1e-6)
    np.testing.assert_allclose(EDM.c_noise(sigma), np.log(sigma) / 4, rtol=1e-6)
    np.testing.assert_allclose(EDM.loss_weight(sigma), (sigma**2 + sd**2) / (sigma * sd) ** 2, rtol=1e-6)
    # At σ = σ_data the skip and output scales balance: c_skip = 1/2, c_out = σ_data/√2.
    assert float(EDM.c_skip(jnp.asarray(0.5))) == pytest.approx(0.5)
    assert float(EDM.c_out(jnp.asarray(0.5))) == pytest.approx(0.5 / np.sqrt(2))


def test_training_sigma_is_lognormal_with_the_preset_moments():
    sigma = EDM.sample_training_sigma(jax.random.PRNGKey(0), 200_000)
    log_sigma = np.log(np.asarray(sigma))
    assert log_sigma.mean() == pytest.approx(-1.2, abs=0.01)
    assert log_sigma.std() == pytest.approx(1.2, abs=0.01)


def test_sigma_schedule_is_eq_5():
    sigmas = np.asarray(EDM.sigmas(18))
    assert sigmas.shape == (18,)
    assert sigmas[0] == pytest.approx(80.0, rel=1e-5)
    assert sigmas[-1] == pytest.approx(0.002, rel=1e-4)
    assert np.all(np.diff(sigmas) < 0)
    i = 5
    expected = (80 ** (1 / 7) + i / 17 * (0.002 ** (1 / 7) - 80 ** (1 / 7))) ** 7
    assert sigmas[i] == pytest.approx(expected, rel=1e-5)


def test_bad_process_parameters_are_named():
    with pytest.raises(ValueError, match="sigma_min"):
        Process(sigma_min=1.0, sigma_max=0.5)
    with pytest.raises(ValueError, match="steps must be >= 2"):
        EDM.sigmas(1)


def gaussian_denoiser(s: float):
    return lambda x, sigma: x * s**2 / (s**2 + sigma**2)


@pytest.mark.parametrize("solver", ["euler", "heun"])
def test_solvers_recover_the_data_variance_of_a_gaussian(solver):
    s = 0.5
    noise = jax.random.normal(jax.random.PRNGKey(0), (20_000, 4))
    out = jax.jit(lambda n: sample(gaussian_denoiser(s), n, EDM.sigmas(32), solver))(noise)
    assert float(jnp.std(out)) == pytest.approx(s, rel=0.03 if solver == "heun" else 0.1)


def test_heun_is_second_order_and_euler_first_order_on_the_exact_flow():
    # For the Gaussian the ODE solution is x(σ) = x(σ_max) · sqrt((s²+σ²)/(s²+σ_max²)) exactly.
    s = 0.5
    noise = jax.random.normal(jax.random.PRNGKey(1), (256, 2))

    def error(solver: str, steps: int) -> float:
        sigmas = EDM.sigmas(steps)
        exact = noise * sigmas[0] * jnp.sqrt((s**2 + sigmas[-1] ** 2) / (s**2 + sigmas[0] ** 2))
        exact = gaussian_denoiser(s)(exact, sigmas[-1])
        return float(jnp.max(jnp.abs(sample(gaussian_denoiser(s), noise, sigmas, solver) - exact)))

    # Doubling the intervals (50 -> 100 points, 49 -> 99 intervals) divides the error by ~2^order.
    assert 1.7 < error("euler", 50) / error("euler", 99) < 2.3
    assert 3.4 < error("heun", 50) / error("heun", 99) < 4.6
    assert error("heun", 50) < error("euler", 50) / 5


def test_cfg_applies_only_inside_its_sigma_interval():
    cond = lambda x, sigma: jnp.full_like(x, 2.0)  # noqa: E731
    uncond = lambda x, sigma: jnp.full_like(x, 1.0)  # noqa: E731
    guided = CFG(weight=3.0, sigma_lo=0.5, sigma_hi=5.0)(cond, uncond)
    x = jnp.zeros((1, 2))
    assert float(guided(x, jnp.float32(1.0))[0, 0]) == pytest.approx(1.0 + 3.0 * (2.0 - 1.0))
    assert float(guided(x, jnp.float32(10.0))[0, 0]) == 2.0
    assert float(guided(x, jnp.float32(0.1))[0, 0]) == 2.0
    assert CFG(weight=1.0)(cond, uncond) is cond
    with pytest.raises(ValueError, match="sigma_lo"):
        CFG(weight=2.0, sigma_lo=3.0, sigma_hi=1.0)
