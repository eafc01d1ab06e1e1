"""``optimizer.mu_dtype``: Adam's first moment stored in bfloat16 (optax's ``mu_dtype``), the
second moment, the parameters and the update arithmetic in float32; float32 by default."""

from __future__ import annotations

from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers_common import tiny_config

from dew.schema import ConfigError
from dew.training.learning_rate import make_optimizer
from dew.training.trainer_config import resolve_config


def moments(mu_dtype: str, grads: dict) -> tuple[optax.ScaleByAdamState, dict[str, jax.Array]]:
    config = resolve_config(tiny_config(**{"optimizer.mu_dtype": mu_dtype}))
    optimizer = make_optimizer(config)
    params = jax.tree.map(jnp.zeros_like, grads)
    updates, state = optimizer.update(grads, optimizer.init(params), params)
    adam = next(
        s
        for s in jax.tree.leaves(state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
        if isinstance(s, optax.ScaleByAdamState)
    )
    return adam, cast(dict[str, jax.Array], updates)


def test_the_first_moment_is_kept_in_the_dtype_asked_and_nothing_else_is():
    rng = np.random.default_rng(0)
    grads = {"w": jnp.asarray(rng.normal(size=(5, 7)), jnp.float32)}
    adam32, _ = moments("float32", grads)
    adam16, updates16 = moments("bfloat16", grads)
    assert adam32.mu["w"].dtype == jnp.float32 and adam16.mu["w"].dtype == jnp.bfloat16
    assert adam16.nu["w"].dtype == jnp.float32 and updates16["w"].dtype == jnp.float32
    # the first update's moment is (1 − β1)·g, stored rounded to bfloat16: exactly the rounding
    np.testing.assert_array_equal(
        np.asarray(adam16.mu["w"], np.float32), np.asarray(adam32.mu["w"].astype(jnp.bfloat16), np.float32)
    )
    np.testing.assert_array_equal(np.asarray(adam16.nu["w"]), np.asarray(adam32.nu["w"]))


def test_an_unknown_moment_dtype_is_one_line_naming_the_field():
    with pytest.raises(ConfigError, match=r"optimizer\.mu_dtype.*float16.*bfloat16"):
        resolve_config(tiny_config(**{"optimizer.mu_dtype": "float16"}))
