"""No silent wrong answers from ``sample``: a trailing σ = 0 is the clean prediction for every
solver (never a NaN, never D at σ = 0), bad schedules and a pre-scaled start are refused, the
Karras schedule over any range is public, and a per-step callback sees (x, denoised, σ)."""

from __future__ import annotations

import pathlib

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest

import dew
from dew.data.sources.mixture import RING
from dew.diffusion import EDM
from dew.sampling import EDMStochastic, check_unit_noise, karras_sigmas, sample, trajectory

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

SOLVERS = ["euler", "heun", "dpmpp_2m", EDMStochastic(), EDMStochastic(second_order=False)]
REFERENCE = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "k_diffusion" / "reference.npz"


def guarded(denoise):
    """The mixture's exact denoiser, which must never be asked about σ <= 0."""

    def inner(x, sigma):
        return jnp.where(sigma > 0, denoise(x, sigma), jnp.nan)

    return inner


@pytest.mark.parametrize("solver", SOLVERS, ids=str)
@pytest.mark.parametrize("traced", [False, True], ids=["known", "traced"])
def test_a_trailing_zero_is_the_clean_prediction_at_the_point_before_it(solver, traced):
    noise = jax.random.normal(jax.random.PRNGKey(0), (256, 2))
    rng = jax.random.PRNGKey(1)
    positive = karras_sigmas(8, 0.002, 80.0)
    with_zero = karras_sigmas(8, 0.002, 80.0, append_zero=True)
    denoise = guarded(RING.denoise)
    if traced:  # the schedule is an argument of the jitted function: values unknown at trace time
        run = jax.jit(lambda s: sample(denoise, noise, s, solver, rng=rng))
        a, b = (
            run(jnp.asarray(positive)),
            jax.jit(lambda s: sample(denoise, noise, s, solver, rng=rng))(jnp.asarray(with_zero)),
        )
    else:
        a = sample(denoise, noise, positive, solver, rng=rng)
        b = sample(denoise, noise, with_zero, solver, rng=rng)
    assert np.isfinite(np.asarray(b)).all()
    # Same program structure on both sides but the discarded last interval: equal to float
    # round-off of one compiled program against another (a few ulp of values of size ~2).
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["euler", "heun", "dpmpp_2m"])
def test_the_trailing_zero_result_is_k_diffusions_own(name):
    # k-diffusion's samplers over their own schedule with its trailing 0 (reference vectors made
    # by k-diffusion in float64, third_party/k_diffusion/README.md): dew given that same schedule,
    # zero included, lands on k-diffusion's final samples, at the parity test's float32 tolerance.
    from tests.test_sampling_parity import mixture

    with np.load(REFERENCE, allow_pickle=False) as data:
        ref = dict(data)
    sigmas = ref["sigmas_karras"]
    assert sigmas[-1] == 0.0
    noise = jnp.asarray(ref["input_noise"], jnp.float32)
    out = sample(guarded(mixture(ref).denoise), noise, sigmas.astype(np.float32), name)
    np.testing.assert_allclose(np.asarray(out), ref[f"{name}_output"], atol=1e-5)


@pytest.mark.parametrize(
    "sigmas, message",
    [
        ([80.0, 1.0, 0.0, 0.5], r"> 0 at every point but a trailing 0"),
        ([1.0, 2.0, 0.5], r"decrease strictly"),
        ([80.0, -1.0], r"> 0 at every point"),
        ([80.0, np.nan, 0.1], r"finite"),
        ([0.0, 0.0], r"> 0 at every point"),
        ([80.0], r">= 2 points"),
    ],
)
def test_a_schedule_sample_cannot_follow_is_refused(sigmas, message):
    noise = jax.random.normal(jax.random.PRNGKey(0), (64, 2))
    with pytest.raises(ValueError, match=message):
        sample(RING.denoise, noise, np.asarray(sigmas, np.float32), "heun")


def test_a_start_already_scaled_by_sigma_max_is_refused_and_unit_noise_is_not():
    sigmas = karras_sigmas(6, 0.002, 80.0)
    noise = jax.random.normal(jax.random.PRNGKey(0), (64, 2))
    with pytest.raises(
        ValueError, match=r"standard deviation of \d\d\.\d+ over 128 values, expected 1 ± 0\.375"
    ):
        sample(RING.denoise, noise * sigmas[0], sigmas, "heun")
    with pytest.raises(ValueError, match="must be standard normal"):
        sample(RING.denoise, noise * 0.5, sigmas, "heun")  # half-scale: 0.5 is 1.33 bounds out
    sample(RING.denoise, noise, sigmas, "euler")  # real unit noise passes
    for seed in range(20):  # ... at any size (false refusals ~1e-9 each): sample's own check
        check_unit_noise(jax.random.normal(jax.random.PRNGKey(seed), (1 + 7 * seed, 2)))


def test_karras_sigmas_is_top_level_spans_any_range_and_matches_the_edm_preset():
    assert dew.karras_sigmas is karras_sigmas
    np.testing.assert_allclose(karras_sigmas(18, 0.002, 80.0), np.asarray(EDM.sigmas(18)), rtol=1e-6)
    s = karras_sigmas(5, 0.5, 3.0, rho=1.0)  # ρ = 1: equal steps in σ
    np.testing.assert_allclose(s, [3.0, 2.375, 1.75, 1.125, 0.5], rtol=1e-6)
    assert karras_sigmas(3, 0.1, 10.0, append_zero=True)[-1] == 0.0
    with pytest.raises(ValueError, match=r"0 < sigma_min < sigma_max"):
        karras_sigmas(8, 5.0, 1.0)
    with pytest.raises(ValueError, match=r"steps must be an int >= 2"):
        karras_sigmas(1, 0.1, 1.0)


@pytest.mark.parametrize("solver", ["heun", EDMStochastic()], ids=str)
def test_the_callback_sees_every_step_and_changes_nothing(solver):
    noise = jax.random.normal(jax.random.PRNGKey(3), (128, 2))
    sigmas = karras_sigmas(7, 0.002, 80.0)
    rng = jax.random.PRNGKey(4)
    seen = []
    out = sample(
        RING.denoise, noise, sigmas, solver, rng=rng, callback=lambda x, d, s: seen.append((x, d, s))
    )
    states, reference = trajectory(RING.denoise, noise, sigmas, solver, rng=rng)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference), atol=1e-5)
    assert [float(s) for _, _, s in seen] == pytest.approx(sigmas.tolist())
    for i, (x, denoised, sigma) in enumerate(seen[:-1]):
        assert isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        np.testing.assert_allclose(np.asarray(x), np.asarray(states[i]), atol=1e-4 * max(1.0, float(sigma)))
        if solver == "heun":  # no churn: the prediction is D(x_i; σ_i) itself
            np.testing.assert_allclose(np.asarray(denoised), np.asarray(RING.denoise(x, sigma)), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(seen[-1][1]), np.asarray(out))
