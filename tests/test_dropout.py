"""``dew.networks.dropout``: haiku's dropout mask bit for bit, without XLA:CPU's hash loops."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dew.networks.dropout import dropout, threefry_bits

SHAPES = [(1,), (5,), (3, 7), (2, 5, 5, 3), (16, 8, 8, 32)]


def test_the_bits_are_jax_random_bits():
    ours = jax.jit(lambda key: [threefry_bits(key, shape) for shape in SHAPES])
    jaxs = jax.jit(lambda key: [jax.random.bits(key, shape, jnp.uint32) for shape in SHAPES])
    for seed in (0, 7, 2**31 + 5):
        key = jax.random.PRNGKey(seed)
        for shape, a, b in zip(SHAPES, ours(key), jaxs(key), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"seed {seed}, shape {shape}")
    typed = jax.random.key(3)
    np.testing.assert_array_equal(threefry_bits(typed, (4, 3)), jax.random.bits(typed, (4, 3), jnp.uint32))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_dropout_is_haikus_value_for_value(rate):
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8, 8, 32))
    outs = []
    for seed in range(3):
        key = jax.random.PRNGKey(seed)
        outs.append(jax.jit(dropout, static_argnums=1)(key, rate, x))
        np.testing.assert_array_equal(outs[-1], jax.jit(hk.dropout, static_argnums=1)(key, rate, x))
    kept = np.mean(np.asarray(outs[-1]) != 0)
    # 32,768 Bernoulli(1 - rate) draws: 6 standard deviations either side.
    assert abs(kept - (1 - rate)) < 6 * np.sqrt(rate * (1 - rate) / x.size)


def test_rate_zero_is_the_identity_and_a_rate_of_one_is_refused():
    x = jnp.arange(6.0)
    assert dropout(jax.random.PRNGKey(0), 0.0, x) is x
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\), got 1.0"):
        dropout(jax.random.PRNGKey(0), 1.0, x)


def hlo(compiled: jax.stages.Compiled) -> str:
    """The compiled program's text (``as_text`` gives None only where a backend has none)."""
    text = compiled.as_text()
    assert text is not None
    return text


def test_one_loop_free_kernel_that_shards_like_its_input():
    """No ``while`` in the compiled program (JAX's own threefry is a rolled loop on CPU), and the
    mask of a batch split over 8 devices is the one-device mask."""
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8, 8, 4))
    key = jax.random.PRNGKey(3)
    single = jax.jit(dropout, static_argnums=1)
    assert " while(" in hlo(jax.jit(hk.dropout, static_argnums=1).lower(key, 0.1, x).compile())
    assert " while(" not in hlo(single.lower(key, 0.1, x).compile())
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    split = NamedSharding(mesh, PartitionSpec("data"))
    sharded = jax.jit(dropout, static_argnums=1, out_shardings=split)(key, 0.1, jax.device_put(x, split))
    assert len(sharded.addressable_shards) == 8
    np.testing.assert_array_equal(sharded, single(key, 0.1, x))
