from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dew.averaging import ema


def test_debiased_zero_initialised_ema_of_constant_params_is_the_params():
    params = {"w": jnp.array([1.5, -2.0]), "b": jnp.array(3.0)}
    average = ema.zeros_like(params)
    for n in range(1, 6):
        average = ema.update(average, params, 0.9)
        np.testing.assert_allclose(ema.debias(average, 0.9, n)["w"], params["w"], rtol=1e-6)
    # Without the correction, the zero start drags the average towards zero.
    assert float(average["b"]) == pytest.approx(3.0 * (1 - 0.9**5))


def test_debias_with_zero_updates_is_a_clear_error():
    with pytest.raises(ValueError, match="num_updates must be >= 1"):
        ema.debias({"w": jnp.zeros(2)}, 0.99, 0)
