"""Every sampler family implements ``dew.sampling.interface.Sampler``, called as
``sampler(model, noise, schedule, rng)``: each registered sampler takes exactly those arguments,
and a sample drawn through the interface is the family's own sample, bit for bit (the interface
adds no arithmetic, so equality is exact, not within a tolerance)."""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import registry
from dew.diffusion.iddpm import GaussianDiffusion
from dew.diffusion.transport import Transport
from dew.sampling.interface import DDPMLoop, MeanFlowLoop, Sampler
from dew.sampling.meanflow import sample_mean_flow
from dew.sampling.repa_sampler import RepaSampler
from dew.sampling.solvers import EDMStochastic, Heun, Solver, sample
from dew.sampling.transport_ode import TransportODE
from dew.sampling.transport_sde import TransportSDE

# Read by the type checker: each family's sampler is a Sampler of its model and schedule types.
FAMILIES: list[Sampler[Any, Any]] = [Heun(), TransportODE(), TransportSDE(), DDPMLoop(), MeanFlowLoop()]

NOISE = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 3))
KEY = jax.random.PRNGKey(1)


def denoise(x: jax.Array, sigma: jax.Array) -> jax.Array:
    """The exact denoiser of N(0, 0.25 I) data: x · σ_data² / (σ² + σ_data²)."""
    return x * 0.25 / (sigma**2 + 0.25)


def velocity(x: jax.Array, t: jax.Array, guide_time: jax.Array | None = None) -> jax.Array:
    """A linear velocity field; ``guide_time`` (REPA's sampler passes it) is unused."""
    return -x * (1.0 + t.reshape((-1,) + (1,) * (x.ndim - 1)))


def registered() -> list[str]:
    return registry.samplers.names()


@pytest.mark.parametrize("name", registered())
def test_every_registered_sampler_takes_model_noise_schedule_rng(name):
    parameters = list(inspect.signature(registry.samplers[name]).parameters)
    assert parameters == ["model", "noise", "schedule", "rng"]


@pytest.mark.parametrize("name", registered())
def test_a_registered_sampler_draws_its_family_sample_through_the_interface(name):
    sampler = registry.samplers[name]
    if isinstance(sampler, Solver):
        sigmas = jnp.asarray([80.0, 10.0, 1.0, 0.1, 0.0])
        rng = KEY if sampler.stochastic else None
        got = sampler(denoise, NOISE, sigmas, rng)
        want = sample(denoise, NOISE, sigmas, sampler, rng=rng)
    else:
        assert isinstance(sampler, TransportODE | TransportSDE | RepaSampler), type(sampler)
        transport = Transport.create("Linear")
        small = _few_steps(sampler)
        got = small(velocity, NOISE, transport, KEY)
        want = small.sample(transport, velocity, NOISE, KEY)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _few_steps(sampler: Any) -> Any:
    """The sampler with 4 steps (a fixed-step ODE for the adaptive one), to keep the test small."""
    import dataclasses

    if isinstance(sampler, TransportODE) and sampler.method == "dopri5":
        return dataclasses.replace(sampler, method="euler", num_steps=4)
    return dataclasses.replace(sampler, num_steps=4)


def test_a_stochastic_solver_uses_the_key_it_is_given():
    sigmas = jnp.asarray([10.0, 1.0, 0.1])
    solver = EDMStochastic(s_churn=40.0)
    a = solver(denoise, NOISE, sigmas, KEY)
    assert not np.array_equal(
        np.asarray(a), np.asarray(solver(denoise, NOISE, sigmas, jax.random.PRNGKey(7)))
    )


@pytest.mark.parametrize("method", ["ddpm", "ddim"])
def test_the_iddpm_loop_is_sample_loop(method):
    diffusion = GaussianDiffusion.create("4", learn_sigma=False)

    def model(x: jax.Array, t: jax.Array) -> jax.Array:  # an ε prediction
        return 0.5 * x + 0.01 * t.reshape((-1,) + (1,) * (x.ndim - 1))

    got = DDPMLoop(method=method)(model, NOISE, diffusion, KEY)
    want = diffusion.sample_loop(model, NOISE, rng=KEY, clip_denoised=False, method=method, trajectory=False)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_meanflow_loop_is_sample_mean_flow():
    def u(z: jax.Array, t: jax.Array, h: jax.Array) -> jax.Array:
        return z * (1.0 + t.reshape(-1, 1, 1, 1)) - h.reshape(-1, 1, 1, 1)

    schedule = (1.0, 0.5, 0.0)
    got = MeanFlowLoop()(u, NOISE, schedule, None)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(sample_mean_flow(u, NOISE, schedule)))
