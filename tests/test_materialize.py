"""``dew.networks.materialize``: values (and, in reverse mode, cotangents) that XLA:CPU computes once
into their own buffer. The values and derivatives must be exactly those without it, and on XLA:CPU
the chain feeding a convolution must be computed in one kernel, whatever XLA would fuse it into
without the mark."""

from __future__ import annotations

import re

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.networks import edm_layers, materialize


def _chain(x, a):
    return jnp.abs(x * a + 1.0)


def _model(x, w, a, marked: bool, readout=None):
    """sum(sin(conv(|x a + 1|, w))), or sum(conv(...) * readout): linear in the output."""
    h = _chain(x, a)

    def convolve(v):
        return edm_layers._xla_conv(v, w, 1)

    y = materialize.marked(convolve, h, w[0, 0, 0, 0]) if marked else convolve(h)
    return jnp.sum(jnp.sin(y)) if readout is None else jnp.sum(y * readout)


@pytest.fixture
def inputs():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 8, 8, 3)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 3, 4)), jnp.float32)
    return x, w, jnp.float32(0.7)


def test_values_and_both_derivatives_are_exactly_those_without_it(inputs):
    # Op by op (no jit), so that nothing but the marks differs between the two programs.
    x, w, a = inputs
    value, grads = jax.value_and_grad(_model, argnums=(0, 1, 2))(x, w, a, True)
    value_ref, grads_ref = jax.value_and_grad(_model, argnums=(0, 1, 2))(x, w, a, False)
    np.testing.assert_array_equal(value, value_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        np.testing.assert_array_equal(g, g_ref)
    tangents = (jnp.ones_like(x), jnp.full_like(w, 0.5), jnp.float32(2.0))
    _, forward = jax.jvp(lambda x, w, a: _model(x, w, a, True), inputs, tangents)
    _, forward_ref = jax.jvp(lambda x, w, a: _model(x, w, a, False), inputs, tangents)
    np.testing.assert_array_equal(forward, forward_ref)


def test_compiled_the_weight_gradient_is_the_exact_one_up_to_float32_rounding(inputs):
    # Compiled, XLA fuses the chain differently with and without the marks (an FMA or a multiply
    # and an add), so both are held to the float64 gradient instead. With a loss linear in the
    # output, dL/dw[i, j] = Σ_{b,r,s} h_pad[b, r+i, s+j] ⊗ c[b, r, s], h = |x a + 1|: each term is at
    # most three float32 roundings from exact (h's multiply and add, the product) and the n-term
    # sum adds n more, so |error| <= γ_{n+3} Σ|terms| (Higham, Accuracy and Stability of Numerical
    # Algorithms, eq. 3.5; γ_k = k u / (1 - k u)).
    x, w, a = inputs
    c = jnp.asarray(np.random.default_rng(1).standard_normal((2, 8, 8, 4)), jnp.float32)

    h = np.abs(np.asarray(x, np.float64) * np.float64(a) + 1.0)
    hp, g = np.pad(h, ((0, 0), (1, 1), (1, 1), (0, 0))), np.asarray(c, np.float64)
    exact, magnitude = np.empty(w.shape), np.empty(w.shape)
    for i in range(3):
        for j in range(3):
            exact[i, j] = np.einsum("brsc,brso->co", hp[:, i : i + 8, j : j + 8], g)
            magnitude[i, j] = np.einsum("brsc,brso->co", np.abs(hp[:, i : i + 8, j : j + 8]), np.abs(g))
    k, u = 2 * 8 * 8 + 3, np.finfo(np.float32).eps / 2
    bound = k * u / (1 - k * u) * magnitude
    for marked in (False, True):
        dw = np.asarray(
            jax.jit(jax.grad(_model, argnums=1), static_argnums=3)(x, w, a, marked, c), np.float64
        )
        assert np.all(np.abs(dw - exact) <= bound), (marked, np.max(np.abs(dw - exact) / bound))


def test_the_token_gets_no_gradient_and_a_batched_token_still_returns_the_value(inputs):
    x = inputs[0]
    assert float(jax.grad(lambda t: jnp.sum(materialize.materialized(x, t)))(jnp.float32(3.0))) == 0.0
    tokens = jnp.asarray([1.0, -2.0, np.nan], jnp.float32)  # vmap turns the conditional into a select
    np.testing.assert_array_equal(
        jax.vmap(lambda t: materialize.computed_once(x, t))(tokens), jnp.stack([x] * 3)
    )


def _optimized_hlo(fn, *args) -> str:
    text = jax.jit(fn).lower(*args).compile().as_text()
    assert text is not None
    return text


def test_on_xla_cpu_the_chain_is_computed_in_one_kernel_not_in_the_weight_gradients_transposes(inputs):
    x, w, a = inputs
    assert jax.default_backend() == "cpu"
    hlo = {
        marked: _optimized_hlo(jax.grad(lambda w_, x_, a_, m=marked: _model(x_, w_, a_, m)), w, x, a)
        for marked in (False, True)
    }
    # The mechanism: the marks' conditionals (the value's, and the transposed one on the cotangent)
    # survive XLA's simplifier, which is target-independent; without marks there are none.
    assert hlo[False].count(" conditional(") == 0
    assert hlo[True].count(" conditional(") == 2
    # Only w is differentiated, so the chain's |·| is needed once, as the convolution's input; with
    # the mark it is computed exactly once, into the buffer every consumer reads. Whether XLA would
    # otherwise re-fuse it into the transpose that lays the input out for the weight gradient (jaxlib
    # 0.10.2 does, on an AVX-512 Xeon with YNNPACK or Eigen convolutions: two |·|) is XLA's fusion
    # and layout choice, not dew's behaviour, and may differ with the build or the CPU: reported in
    # the message, not asserted.
    abs_ops = {
        marked: len(re.findall(r"= f32\[[\d,]*\]\{[\d,]*\} abs\(", text)) for marked, text in hlo.items()
    }
    assert abs_ops[False] >= 1, abs_ops  # the pattern finds XLA's |·| at all
    assert abs_ops[True] == 1, abs_ops


def _marks(fn, *args) -> tuple[int, int, int]:
    """(marks, conditionals) in the program of ``fn``; the conditionals XLA keeps in its gradient's."""
    program = str(jax.make_jaxpr(fn)(*args))
    gradient = jax.grad(lambda *a: jnp.sum(fn(*a)), argnums=tuple(range(len(args))))
    compiled = jax.jit(gradient).lower(*args).compile().as_text()
    assert compiled is not None
    return program.count("custom_jvp_call"), program.count("cond["), compiled.count(" conditional(")


def test_conv_and_group_norm_mark_on_cpu_and_only_their_gradients_pay_for_it(monkeypatch, inputs):
    x, w, _ = inputs
    norm = hk.without_apply_rng(
        hk.transform(lambda x_: edm_layers.GroupNorm(num_groups=1, min_channels_per_group=1)(x_))
    )
    params = norm.init(None, x)
    on_cpu = norm.apply(params, x)
    # Two marks each; no conditional where nothing is differentiated (sampling); under a gradient
    # the input's conditional and the output gradient's (transposed into the backward pass).
    assert _marks(lambda x_, w_: edm_layers.conv(x_, w_, 1), x, w) == (2, 0, 2)
    assert _marks(lambda p, x_: norm.apply(p, x_), params, x) == (2, 0, 2)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert _marks(lambda x_, w_: edm_layers.conv(x_, w_, 1), x, w) == (0, 0, 0)
    assert _marks(lambda p, x_: norm.apply(p, x_), params, x) == (0, 0, 0)
    np.testing.assert_array_equal(norm.apply(params, x), on_cpu)
