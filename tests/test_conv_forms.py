"""``dew.networks.conv_forms``: every (input gradient, weight gradient) form of a convolution is the
same sum as XLA's in another order, so each may differ from the exact (float64) gradient only by
float32 rounding, bounded below; the forward pass is XLA's, bit for bit; and a layer takes the
forms the platform's choice names for its shape class."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import kernels
from dew.networks import conv_forms, edm_layers

SHAPES = [((2, 8, 8, 3), 3, 1, 5), ((2, 9, 7, 4), 3, 2, 3), ((2, 6, 6, 2), 5, 2, 3), ((3, 6, 6, 2), 3, 0, 4)]
U = np.finfo(np.float32).eps / 2


def _gamma(n: int) -> float:
    """γ_n = n u / (1 − n u): the relative bound on a float32 sum of n products in any order
    (Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.5)."""
    return float(n * U / (1 - n * U))


def _exact(x, w, g, pad):
    """dx and dw in float64 by their definitions, with the sums of |terms| that bound the error."""
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    k = w.shape[0]
    xp = np.pad(x64, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    h, wd = g.shape[1:3]
    dw, dw_abs = np.empty(w.shape), np.empty(w.shape)
    dxp, dxp_abs = np.zeros(xp.shape), np.zeros(xp.shape)
    for i, j in itertools.product(range(k), range(k)):
        window = xp[:, i : i + h, j : j + wd, :]
        dw[i, j] = np.einsum("brsc,brso->co", window, g64)
        dw_abs[i, j] = np.einsum("brsc,brso->co", np.abs(window), np.abs(g64))
        dxp[:, i : i + h, j : j + wd, :] += np.einsum("brso,co->brsc", g64, w64[i, j])
        dxp_abs[:, i : i + h, j : j + wd, :] += np.einsum("brso,co->brsc", np.abs(g64), np.abs(w64[i, j]))
    crop = (slice(None), slice(pad, pad + x.shape[1]), slice(pad, pad + x.shape[2]), slice(None))
    return dxp[crop], dxp_abs[crop], dw, dw_abs


@pytest.mark.parametrize("shape, kernel, pad, out", SHAPES)
def test_every_form_is_the_exact_gradient_up_to_float32_rounding(shape, kernel, pad, out):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    w = jnp.asarray(rng.standard_normal((kernel, kernel, shape[-1], out)), jnp.float32)
    y_ref = conv_forms.xla_conv(x, w, pad)
    g = jnp.asarray(rng.standard_normal(y_ref.shape), jnp.float32)
    dx_exact, dx_abs, dw_exact, dw_abs = _exact(x, w, g, pad)
    n_dx, n_dw = kernel * kernel * out, g.shape[0] * g.shape[1] * g.shape[2]
    for input_form, weight_form in itertools.product(conv_forms.INPUT_FORMS, conv_forms.WEIGHT_FORMS):
        y, pullback = jax.vjp(
            lambda a, b, i=input_form, f=weight_form: conv_forms.convolve(a, b, pad, i, f), x, w
        )
        dx, dw = pullback(g)
        np.testing.assert_array_equal(y, y_ref)  # the forward is XLA's whatever the forms
        forms = (input_form, weight_form)
        assert np.all(np.abs(np.asarray(dx, np.float64) - dx_exact) <= _gamma(n_dx) * dx_abs), forms
        assert np.all(np.abs(np.asarray(dw, np.float64) - dw_exact) <= _gamma(n_dw) * dw_abs), forms


def test_unknown_forms_are_refused_in_one_line():
    x, w = jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 2))
    with pytest.raises(ValueError, match="input gradient form 'col2im' is not one of"):
        conv_forms.convolve(x, w, 1, "col2im", "xla")
    with pytest.raises(ValueError, match="weight gradient form 'fft' is not one of"):
        conv_forms.convolve(x, w, 1, "xla", "fft")


def test_a_layer_takes_the_forms_named_for_its_shape_class(monkeypatch):
    chosen = (8, 8, 2, 3, 3, 1)
    forms = frozenset({(chosen, "im2col", "per_tap")})
    choice = kernels.KernelChoice(None, "test", per_tap_convolutions=frozenset(), convolution_forms=forms)
    monkeypatch.setattr(kernels, "_current", choice)
    x, w = jnp.ones((1, 8, 8, 2)), jnp.ones((3, 3, 2, 3))
    assert kernels.convolution_forms(64, chosen) == ("im2col", "per_tap")
    assert kernels.convolution_forms(64, (8, 8, 2, 4, 3, 1)) == ("xla", "xla")  # not named: XLA's
    seen = []

    def convolve(x_, w_, pad, i, f):
        seen.append((i, f))
        return conv_forms.xla_conv(x_, w_, pad)

    monkeypatch.setattr(conv_forms, "convolve", convolve)
    edm_layers.conv(x, w, 1)
    edm_layers.conv(x, jnp.ones((3, 3, 2, 4)), 1)
    assert seen == [("im2col", "per_tap"), ("xla", "xla")]
