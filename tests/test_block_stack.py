"""``scan_blocks``: the DiT family's blocks as one ``lax.scan`` over their stacked parameters are
the unrolled network: the same parameters (names, shapes, initial values) and the same outputs and
gradients (``dew.networks.block_stack``)."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.networks.dit import DiT

EPS = float(np.finfo(np.float32).eps)

SMALL = {"depth": 3, "hidden_size": 32, "num_heads": 2, "patch_size": 2, "num_classes": 5}
CASES = {
    "sit": dict(SMALL, sigma_output=False),
    "sit-remat": dict(SMALL, sigma_output=False, remat="blocks"),
    "repa": dict(SMALL, sigma_output=False, encoder_depth=2, projector_dims=(16,), projector_hidden=24),
    "imf": dict(
        depth=3,
        hidden_size=32,
        num_heads=2,
        patch_size=2,
        num_classes=5,
        conditioning="in_context",
        head_depth=1,
        v_head=True,
        time_inputs=("h",),
        class_dropout_prob=0.0,
        null_class=True,
        learn_sigma=False,
        mlp_ratio=8 / 3,
        class_tokens=2,
        time_tokens=1,
        cfg_tokens=1,
        interval_tokens=1,
    ),
}


def _network(options: dict, scan: bool):
    imf = options.get("conditioning") == "in_context"
    repa = "encoder_depth" in options

    def forward(x, t, y):
        net = DiT(**options, scan_blocks=scan)
        if imf:
            return net(x, t, y, h=t, omega=jnp.ones_like(t), t_min=0 * t, t_max=1 + 0 * t)
        return net(x, t, y, return_features=repa)

    return hk.without_apply_rng(hk.transform(forward))


def _inputs():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 8, 8, 4)), jnp.float32)
    t = jnp.asarray([0.3, 0.8], jnp.float32)
    y = jnp.asarray([1, 4], jnp.int32)
    return x, t, y


def _perturbed(params):
    """Non-zero everywhere (adaLN-Zero starts its gates at zero, which would hide the blocks)."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    return jax.tree.unflatten(
        tree, [p + 0.05 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys, strict=True)]
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_scanned_blocks_are_the_unrolled_network(case):
    options = CASES[case]
    x, t, y = _inputs()
    unrolled, scanned = _network(options, False), _network(options, True)
    p_unrolled = unrolled.init(jax.random.PRNGKey(0), x, t, y)
    p_scanned = scanned.init(jax.random.PRNGKey(0), x, t, y)
    assert jax.tree.structure(p_unrolled) == jax.tree.structure(p_scanned)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), p_unrolled, p_scanned)))
    params = _perturbed(p_unrolled)

    def loss(net):
        def f(p):
            out = net.apply(p, x, t, y)
            return sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(out))

        return jax.jit(jax.value_and_grad(f))

    (value_u, grads_u), (value_s, grads_s) = loss(unrolled)(params), loss(scanned)(params)
    # The same operations in the same order; only XLA's fusion of them may differ: a few float32
    # roundings per block on each value, so depth x a few ulps of the largest magnitude.
    bound = 8 * options["depth"] * EPS
    np.testing.assert_allclose(value_s, value_u, rtol=bound)
    for g_s, g_u in zip(jax.tree.leaves(grads_s), jax.tree.leaves(grads_u), strict=True):
        scale = float(jnp.max(jnp.abs(g_u))) or 1.0
        np.testing.assert_allclose(g_s, g_u, rtol=0, atol=bound * scale)


def test_the_scan_compiles_one_block():
    """The scanned program holds one block's matrix products, the unrolled one depth of them."""
    options = dict(CASES["sit"], depth=6)
    x, t, y = _inputs()
    counts = {}
    for scan in (False, True):
        net = _network(options, scan)
        params = net.init(jax.random.PRNGKey(0), x, t, y)
        text = jax.jit(net.apply).lower(params, x, t, y).as_text()
        counts[scan] = text.count("stablehlo.dot_general")
    assert counts[True] < counts[False] / 3, counts
