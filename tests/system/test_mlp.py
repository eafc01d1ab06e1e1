"""``dew.models["mlp"]``: the residual denoiser, and the plain textbook MLP one override away."""

from __future__ import annotations

import pathlib

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew

ROOT = pathlib.Path(__file__).resolve().parents[2]


def init(**options):
    net = hk.transform(lambda x, s: dew.models["mlp"](**options)(x, s))
    x = jnp.ones((4, 2))
    return net, net.init(jax.random.PRNGKey(0), x, jnp.ones((4,)))


def test_the_plain_mlp_is_the_3_128_128_2_toy_network():
    net, params = init(width=128, blocks=2, residual=False)
    shapes = {f"{m}/{k}": v.shape for m, leaves in params.items() for k, v in leaves.items()}
    # [x (2), noise level (1)] -> 128 -> 128 -> 2: nothing else (no embedding, no norm, no skip).
    assert shapes == {
        "mlp/hidden0/w": (3, 128),
        "mlp/hidden0/b": (128,),
        "mlp/hidden1/w": (128, 128),
        "mlp/hidden1/b": (128,),
        "mlp/proj_out/w": (128, 2),
        "mlp/proj_out/b": (2,),
    }
    # It is exactly silu(silu([x, s] W0 + b0) W1 + b1) W2 + b2.
    x, s = jax.random.normal(jax.random.PRNGKey(1), (5, 2)), jnp.linspace(0.1, 2.0, 5)
    p = {k.split("/")[-1]: v for k, v in params.items()}
    h = jax.nn.silu(jnp.concatenate([x, s[:, None]], -1) @ p["hidden0"]["w"] + p["hidden0"]["b"])
    h = jax.nn.silu(h @ p["hidden1"]["w"] + p["hidden1"]["b"])
    expected = h @ p["proj_out"]["w"] + p["proj_out"]["b"]
    np.testing.assert_allclose(net.apply(params, None, x, s), expected, rtol=1e-5, atol=1e-6)


def test_the_residual_mlp_stays_the_default():
    _, params = init(width=16, blocks=2)
    assert "mlp/affine1" in params and "mlp/norm0" not in params  # LayerNorm without params
    assert not np.any(params["mlp/proj_out"]["w"])  # zero-initialised output: F starts at 0
    with pytest.raises(ValueError, match="residual must be True or False"):
        init(width=16, blocks=2, residual="no")


def test_the_toy_is_one_override_of_the_mixture_experiment(tmp_path):
    from dew.config import apply_overrides, load_config
    from dew.training.trainer import Trainer

    config = apply_overrides(
        load_config(str(ROOT / "experiments" / "mixture2d.py")),
        ["config.model.residual=False", "config.model.blocks=2", "config.mesh.devices=1"],
    )
    trainer = Trainer(config, str(tmp_path / "run"))
    params = jax.eval_shape(trainer.programs.init, jax.random.PRNGKey(0), trainer.example_batch()).params
    sizes = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(params))
    assert sizes == 3 * 128 + 128 + 128 * 128 + 128 + 128 * 2 + 2
