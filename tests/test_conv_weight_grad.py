"""``dew.networks.edm_layers``' per-tap convolution weight gradient, taken by ``conv`` for large
images on CPUs where XLA's is slow. Its forward and input gradient are XLA's own (bit-identical);
its weight gradient is the same sum as XLA's in another order, so the two may differ only by
float32 rounding, bounded below."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import kernels
from dew.networks.edm_layers import _conv_tap_weight_grad, _xla_conv, conv
from dew.runtime.cpu import flags as cpu_convolutions
from dew.runtime.cpu.flags import TAPWISE_MIN_POSITIONS


@pytest.mark.parametrize(
    "shape, kernel, pad, out",
    [((4, 8, 8, 3), 3, 1, 6), ((2, 9, 7, 5), 3, 2, 4), ((2, 8, 8, 4), 5, 2, 3), ((3, 6, 6, 2), 3, 0, 5)],
)
def test_the_per_tap_weight_gradient_is_xlas_up_to_float32_rounding(shape, kernel, pad, out):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    w = jnp.asarray(rng.standard_normal((kernel, kernel, shape[-1], out)), jnp.float32)
    cotangent = jnp.asarray(rng.standard_normal(_xla_conv(x, w, pad).shape), jnp.float32)
    y, vjp = jax.vjp(lambda x_, w_: _conv_tap_weight_grad(x_, w_, pad), x, w)
    y_ref, vjp_ref = jax.vjp(lambda x_, w_: _xla_conv(x_, w_, pad), x, w)
    (dx, dw), (dx_ref, dw_ref) = vjp(cotangent), vjp_ref(cotangent)
    np.testing.assert_array_equal(y, y_ref)  # XLA's forward
    np.testing.assert_array_equal(dx, dx_ref)  # XLA's input gradient
    # dw[i, j] = Σ_{b,r,s} x_pad[b, r+i, s+j] ⊗ g[b, r, s], exactly (float64), and the bound on a
    # float32 dot product of n terms in any order: |error| <= γ_n Σ|terms|, γ_n = n u / (1 - n u)
    # (Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.5), for each of the two.
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    g = np.asarray(cotangent, np.float64)
    h, wd = g.shape[1:3]
    exact = np.empty(dw.shape)
    magnitude = np.empty(dw.shape)
    for i in range(kernel):
        for j in range(kernel):
            window = xp[:, i : i + h, j : j + wd, :]
            exact[i, j] = np.einsum("brsc,brso->co", window, g)
            magnitude[i, j] = np.einsum("brsc,brso->co", np.abs(window), np.abs(g))
    n, u = g.shape[0] * h * wd, np.finfo(np.float32).eps / 2
    bound = n * u / (1 - n * u) * magnitude
    assert np.all(np.abs(np.asarray(dw, np.float64) - exact) <= bound)
    assert np.all(np.abs(np.asarray(dw_ref, np.float64) - exact) <= bound)


@pytest.mark.parametrize("slow_here", [True, False])
def test_conv_takes_the_per_tap_gradient_from_32x32_up_where_xlas_is_slow(monkeypatch, slow_here):
    monkeypatch.setattr(cpu_convolutions, "xla_weight_grad_is_slow", lambda *_: slow_here)
    monkeypatch.setattr(kernels, "_current", cpu_convolutions.weight_gradient_choice())
    w = jnp.ones((3, 3, 2, 2))
    for side, large in ((16, False), (31, False), (32, True), (64, True)):
        assert (side * side >= TAPWISE_MIN_POSITIONS) == large
        jaxpr = str(jax.make_jaxpr(lambda x_, w_: conv(x_, w_, 1))(jnp.ones((1, side, side, 2)), w))
        assert ("custom_vjp_call" in jaxpr) == (large and slow_here), (side, jaxpr)


def test_only_ynnpack_convolutions_on_x86_cpus_without_avx512_count_as_slow(monkeypatch):
    import numpy._core._multiarray_umath as _multiarray_umath

    from dew.runtime.cpu.flags import EIGEN_ROUTE

    cases = [
        ({"AVX": True, "AVX2": False, "AVX512F": False}, "", True),
        ({"AVX": True, "AVX2": True, "AVX512F": False}, "", True),
        ({"AVX": True, "AVX2": True, "AVX512F": True}, "", False),
        ({}, "", False),
        # the same CPUs with this process's convolutions on Eigen: XLA's gradient is the fast one
        ({"AVX": True, "AVX2": False, "AVX512F": False}, EIGEN_ROUTE, False),
        ({"AVX": True, "AVX2": True, "AVX512F": False}, EIGEN_ROUTE, False),
    ]
    for features, xla_flags, slow in cases:
        monkeypatch.setattr(_multiarray_umath, "__cpu_features__", features)
        monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=1 {xla_flags}")
        assert cpu_convolutions.xla_weight_grad_is_slow() is slow, (features, xla_flags)


def test_a_1x1_kernel_stays_a_matmul():
    x = jnp.ones((2, 4, 4, 3))
    w = jnp.ones((1, 1, 3, 5))
    jaxpr = str(jax.make_jaxpr(lambda x_, w_: conv(x_, w_, 0))(x, w))
    assert "conv_general_dilated" not in jaxpr and "dot_general" in jaxpr
