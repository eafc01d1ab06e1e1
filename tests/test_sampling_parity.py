"""dew's σ schedule and samplers against k-diffusion (Crowson), on the exact denoiser of a 2D
Gaussian mixture. The reference vectors were produced by k-diffusion itself in float64 (see
third_party/k_diffusion/README.md); this test needs no PyTorch."""

from __future__ import annotations

import pathlib
from typing import TypedDict

import jax
import numpy as np
import pytest

from dew.data.sources.mixture import GaussianMixture
from dew.diffusion import EDM
from dew.sampling import DPMSolverPP2M, EDMStochastic, trajectory

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

REFERENCE = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "k_diffusion" / "reference.npz"


class Churn(TypedDict):
    s_churn: float
    s_tmin: float
    s_tmax: float
    s_noise: float


CHURN: Churn = {"s_churn": 40.0, "s_tmin": 0.05, "s_tmax": 50.0, "s_noise": 1.003}


@pytest.fixture(scope="module")
def ref():
    with np.load(REFERENCE, allow_pickle=False) as data:
        return dict(data)


def mixture(ref) -> GaussianMixture:
    return GaussianMixture(
        tuple(map(tuple, ref["input_means"].tolist())),
        tuple(ref["input_stds"].tolist()),
        tuple(ref["input_weights"].tolist()),
    )


def test_karras_schedule_matches_get_sigmas_karras(ref):
    points = int(ref["input_points"])
    np.testing.assert_allclose(np.asarray(EDM.sigmas(points)), ref["sigmas_karras"][:-1], rtol=1e-6)
    assert ref["sigmas_karras"][-1] == 0.0  # k-diffusion's trailing zero is dew's final prediction


SOLVERS = {
    "euler": "euler",
    "heun": "heun",
    "euler_churn": EDMStochastic(**CHURN, second_order=False),
    "heun_churn": EDMStochastic(**CHURN),
    "dpmpp_2m": DPMSolverPP2M(),
}


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_trajectories_match_k_diffusion(ref, name):
    points = int(ref["input_points"])
    run = jax.jit(
        lambda noise: trajectory(
            mixture(ref).denoise,
            noise,
            EDM.sigmas(points),
            SOLVERS[name],
            rng=jax.random.PRNGKey(int(ref["input_churn_seed"])),
        )
    )
    states, output = jax.device_get(run(ref["input_noise"].astype(np.float32)))
    expected = ref[f"{name}_states"]
    assert states.shape == expected.shape
    # float32 against float64: 1e-5 relative to each state's scale (σ_0 = 80 at the start).
    scale = np.maximum(1.0, np.abs(expected).max(axis=(1, 2), keepdims=True))
    assert np.max(np.abs(states - expected) / scale) < 1e-5
    np.testing.assert_allclose(output, ref[f"{name}_output"], atol=1e-5)
