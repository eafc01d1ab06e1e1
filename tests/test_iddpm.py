"""The IDDPM process's bad input (one line naming the field, the value and what is accepted) and
its sampling loop's rng contract."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.diffusion.iddpm import GaussianDiffusion
from dew.schema import ConfigError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"noise_schedule": "cosine"},
            "noise_schedule='cosine' is unknown: expected one of ['linear', 'squaredcos_cap_v2']",
        ),
        (
            {"timestep_respacing": "2000"},
            "timestep_respacing=[2000] is invalid: cannot divide a section of 1000",
        ),
        (
            {"timestep_respacing": "ddim999"},
            "timestep_respacing='ddim999' is invalid: no integer stride gives exactly 999",
        ),
        ({"diffusion_steps": 1}, "diffusion_steps=1 is invalid: expected an int >= 2"),
    ],
)
def test_bad_input_is_one_line(kwargs, message):
    with pytest.raises(ConfigError) as error:
        GaussianDiffusion.create(**kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_unknown_sampling_method_and_missing_noise_are_refused():
    d = GaussianDiffusion.create("4", learn_sigma=False)
    model = lambda x, t: 0.1 * x  # noqa: E731
    z = jnp.ones((2, 2, 2, 1))
    with pytest.raises(ConfigError, match="method='plms' is unknown"):
        d.sample_loop(model, z, rng=jax.random.key(0), method="plms")
    with pytest.raises(ValueError, match="rng= or step_noises="):
        d.sample_loop(model, z)


def test_the_loop_draws_from_rng_reproducibly_and_ends_noise_free():
    d = GaussianDiffusion.create("5", learn_sigma=False)
    model = lambda x, t: 0.1 * x  # noqa: E731
    z = jax.random.normal(jax.random.key(0), (2, 3, 3, 1))
    a = d.sample_loop(model, z, rng=jax.random.key(1))
    b = d.sample_loop(model, z, rng=jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (5, *z.shape)
    # the last step (t = 0) adds no noise: its output is the posterior mean whatever the draw
    last = d.p_sample(model, a[-2], jnp.zeros((2,), jnp.int32), jnp.full(z.shape, 1e3))[0]
    np.testing.assert_allclose(a[-1], last, rtol=1e-6)
