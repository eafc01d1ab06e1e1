"""Per-block rematerialisation (``model.remat``, dew.networks.remat.REMAT_POLICIES) changes
memory, not the function: the same parameters (names, shapes, initial values: bit for bit) and
the same loss and gradients.

The bound for the gradients: XLA does not promise bit-identical results when a program is
restructured (``jax.checkpoint`` recomputes each block's forward inside the backward pass and
the two programs are fused differently), only float32 arithmetic on the same operations, each
rounding with relative error ≤ u = 2^-24. Along the network's longest path (n_f = 146 roundings
forward, n = 292 with the backward pass: counted in tests/system/test_precision.py for this network)
independent roundings give a norm-wise relative difference with standard deviation √(n/3)·u;
the test allows twice it, 2·√(n/3)·u ≈ 1.2e-6, and the loss 2·√(n_f/3)·u. Bit-identical
results are not required (XLA does not guarantee them across a restructured program).
Broken on purpose by scaling each rematerialised block's input by 1 + 2^-12: the gradients then
differ by 6e-4 and the test fails.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import device_batch, tiny_config

from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer_config import resolve_config

U32 = 2.0**-24
FORWARD_ROUNDINGS = 146
NETWORK = {"model.channel_mult": (1, 2), "model.attn_resolutions": (4,), "model.dropout": 0.0}


def objective_for(remat: str, **overrides):
    c = resolve_config(tiny_config(**{**NETWORK, "model.remat": remat, **overrides}))
    return build_objective(c, open_split(c.dataset, "train"))


def loss_and_gradient(objective, params, batch):
    def fn(p, r, b):
        return jax.value_and_grad(objective.loss, has_aux=True)(p, r, b, Step(index=jnp.int32(0)))

    (loss, _), grads = jax.jit(fn)(params, jax.random.PRNGKey(1), batch)
    return float(loss), np.concatenate([np.ravel(np.asarray(g, np.float64)) for g in jax.tree.leaves(grads)])


def digits_batch() -> tuple[dict[str, jax.Array], np.random.Generator]:
    """16 seeded 8×8×1 images (σ 0.5) with labels in 0..9, the batch both equivalence tests use,
    and the generator after drawing it (the tests perturb the parameters from it next)."""
    rng = np.random.default_rng(0)
    batch = {
        "image": (0.5 * rng.normal(size=(16, 8, 8, 1))).astype(np.float32),
        "label": rng.integers(0, 10, 16).astype(np.int32),
    }
    return device_batch(batch), rng


@pytest.mark.parametrize("remat", ["blocks", "blocks_save_dots"])
def test_rematerialised_blocks_give_the_same_parameters_loss_and_gradients(remat):
    batch, rng = digits_batch()
    plain, rematerialised = objective_for("none"), objective_for(remat)
    params = plain.init(jax.random.PRNGKey(0), batch)
    params_remat = rematerialised.init(jax.random.PRNGKey(0), batch)
    assert jax.tree.structure(params) == jax.tree.structure(params_remat)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params_remat), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    params = jax.tree.map(lambda p: p + 0.05 * jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    loss, grads = loss_and_gradient(plain, params, batch)
    loss_r, grads_r = loss_and_gradient(rematerialised, params, batch)
    assert abs(loss_r - loss) <= 2 * math.sqrt(FORWARD_ROUNDINGS / 3) * U32 * abs(loss)
    difference = np.linalg.norm(grads_r - grads) / np.linalg.norm(grads)
    assert difference <= 2 * math.sqrt(2 * FORWARD_ROUNDINGS / 3) * U32, difference


def test_an_unknown_remat_policy_is_refused():
    with pytest.raises((ConfigError, ValueError)) as e:
        objective_for("everything").init(
            jax.random.PRNGKey(0),
            device_batch({"image": np.zeros((2, 8, 8, 1), np.float32), "label": np.zeros(2, np.int32)}),
        )
    assert "remat" in str(e.value) and "blocks" in str(e.value)
