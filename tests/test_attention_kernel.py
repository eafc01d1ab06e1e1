"""``dew.kernels.attention``'s XLA forms: float32 inputs take ``jax.nn.dot_product_attention``
unchanged; low-precision inputs keep their logits and probabilities in the inputs' dtype (the
softmax's arithmetic in float32), within that dtype's roundoff of the float32-logits form."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dew import kernels


def _qkv(dtype, tokens=32, heads=2, width=16):
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal((2, tokens, heads, width)) * 2.0, dtype) for _ in range(3)]


def _with(attention: str):
    return kernels.using(dataclasses.replace(kernels.current(), attention=attention))


def test_float32_inputs_take_jax_attention_unchanged():
    q, k, v = _qkv(jnp.float32)
    with _with("xla"):
        out = kernels.attention(q, k, v)
    np.testing.assert_array_equal(out, jax.nn.dot_product_attention(q, k, v))


def test_bfloat16_logits_stay_bfloat16_in_memory():
    q, k, v = _qkv(jnp.bfloat16)
    for attention, logits in (("xla", jnp.bfloat16), ("xla_float32_logits", jnp.float32)):
        with _with(attention):
            jaxpr = jax.make_jaxpr(lambda *a: kernels.attention(*a))(q, k, v)  # a fresh trace each
        # The first product's result (the logits; nested programs included, any grouping of heads).
        first = next(line for line in str(jaxpr).splitlines() if "dot_general[" in line)
        assert first.split(":")[1].startswith(jnp.dtype(logits).name.replace("float", "f")), (
            attention,
            first,
        )


def test_bfloat16_logits_agree_with_float32_logits_to_bfloat16_roundoff():
    q, k, v = _qkv(jnp.bfloat16)
    with _with("xla"):
        ours = np.asarray(kernels.attention(q, k, v), np.float32)
    exact = np.asarray(jax.nn.dot_product_attention(*(a.astype(jnp.float32) for a in (q, k, v))))
    # Roundings to bfloat16 (u = 2^-8) on the path: the scaled q, the logits, the probabilities
    # and the output, each a relative error u of its value; a logit error δ moves a probability
    # by ~δ relative, and |logit| ≤ ~ |q||k|/√h. The output is a convex combination of v rows, so
    # its error is bounded by (u·max|logit| + 3u)·max|v|.
    u = 2.0**-8
    logits = np.einsum("btnh,bsnh->bnts", *(np.asarray(a, np.float32) for a in (q, k))) / np.sqrt(q.shape[-1])
    bound = (u * np.abs(logits).max() + 3 * u) * float(np.abs(np.asarray(v, np.float32)).max())
    assert np.abs(ours - exact).max() <= bound
