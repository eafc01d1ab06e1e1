"""``HeadsLinear`` and ``HeadsOutput`` (``dew.networks.dit_layers``): ``Linear``'s parameters,
names and initial values, and its numbers, with the heads split off by one product per part
instead of a reshape and slices of one product (the layout a TPU's attention wants)."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.networks.dit_layers import HeadsLinear, HeadsOutput, Linear

B, T, HEADS, WIDTH = 2, 5, 4, 32


def _x(shape):
    return jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)


def _roundoff(terms: int) -> float:
    # a float32 dot of `terms` products, summed in some order, against another order: ~terms · u
    return terms * float(jnp.finfo(jnp.float32).eps) / 2


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_heads_linear_is_linear_reshaped_and_split(parts, bias):
    x = _x((B, T, WIDTH))

    def heads(x):
        return HeadsLinear(HEADS, parts, bias=bias, name="qkv")(x)

    def reference(x):
        y = Linear(parts * WIDTH, bias=bias, name="qkv")(x).reshape(B, T, parts, HEADS, WIDTH // HEADS)
        return [y[:, :, i] for i in range(parts)]

    ours, theirs = hk.without_apply_rng(hk.transform(heads)), hk.without_apply_rng(hk.transform(reference))
    params = ours.init(jax.random.key(1), x)
    reference_params = theirs.init(jax.random.key(1), x)
    # the same names, shapes and initial values: checkpoints and converters see no difference
    assert jax.tree.structure(params) == jax.tree.structure(reference_params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference_params), strict=True):
        np.testing.assert_array_equal(a, b)
    got, want = ours.apply(params, x), theirs.apply(params, x)
    assert [g.shape for g in got] == [(B, T, HEADS, WIDTH // HEADS)] * parts
    scale = float(jnp.max(jnp.abs(x))) * float(jnp.max(jnp.abs(params["qkv"]["weight"])))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=_roundoff(WIDTH) * scale * WIDTH)


def test_heads_output_is_linear_of_the_heads_laid_end_to_end():
    heads = _x((B, T, HEADS, WIDTH // HEADS))

    def ours(h):
        return HeadsOutput(name="proj")(h)

    def reference(h):
        return Linear(WIDTH, name="proj")(h.reshape(B, T, WIDTH))

    a, b = hk.without_apply_rng(hk.transform(ours)), hk.without_apply_rng(hk.transform(reference))
    params = a.init(jax.random.key(2), heads)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(b.init(jax.random.key(2), heads)), strict=True):
        np.testing.assert_array_equal(x, y)
    scale = float(jnp.max(jnp.abs(heads))) * float(jnp.max(jnp.abs(params["proj"]["weight"])))
    np.testing.assert_allclose(
        a.apply(params, heads), b.apply(params, heads), rtol=0, atol=_roundoff(WIDTH) * scale * WIDTH
    )


def test_the_parts_are_products_not_slices_of_one_product():
    """One product per part: no slice of a [B, T, 3 · D] result in the program."""
    x = _x((B, T, WIDTH))
    f = hk.without_apply_rng(hk.transform(lambda x: HeadsLinear(HEADS, 3, name="qkv")(x)))
    params = f.init(jax.random.key(0), x)
    jaxpr = str(jax.make_jaxpr(f.apply)(params, x))
    products = [line for line in jaxpr.splitlines() if "dot_general[" in line]
    assert len(products) == 3
    assert all(f"[{B},{T},{HEADS},{WIDTH // HEADS}]" in line for line in products)
