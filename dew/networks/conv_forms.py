"""Equivalent forms of a stride-1 k×k convolution's gradients (NHWC input × HWIO kernel), from which
the platform's kernel choice takes per shape class (``dew.kernels.convolution_forms``: XLA's, or
what a run recorded).

The forward pass is always XLA's convolution; what changes is how reverse mode computes its two
gradients, each a different XLA program for the same sums (float32 reassociation only):

- input gradient ``dx`` (``INPUT_FORMS``):
  ``xla``: XLA's transposed convolution;
  ``per_tap``: Σ_{i,j} g_pad[:, i:i+H, j:j+W] · w[k−1−i, k−1−j]ᵀ, one [B·H·W, out] × [out, in] matmul
  per kernel tap (g_pad: the output's gradient padded by k−1−pad on each side, cropped where
  that is negative);
  ``im2col``: the same sum as one matmul, [B·H·W, k·k·out] (the k·k shifted windows of g_pad side
  by side) × [k·k·out, in] (the flipped kernel);
- weight gradient ``dw`` (``WEIGHT_FORMS``):
  ``xla``: XLA's, a convolution whose kernel is the whole output gradient;
  ``per_tap``: dw[i, j] = Σ_{b,r,s} x_pad[b, r+i, s+j]ᵀ g[b, r, s], one [in, B·H·W] × [B·H·W, out]
  matmul per tap;
  ``im2col``: the same as one [k·k·in, B·H·W] × [B·H·W, out] matmul over the k·k shifted windows
  of x_pad side by side.

Matmul forms let XLA hand the work to its dot library (YNNPACK) instead of its convolution
kernels; which is faster depends on the CPU and the shape, so nothing here decides it.
``convolve(x, w, pad, input_form, weight_form)`` with both forms ``xla`` is exactly XLA's
convolution (the same program as ``xla_conv``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

INPUT_FORMS = ("xla", "per_tap", "im2col")
WEIGHT_FORMS = ("xla", "per_tap", "im2col")


def xla_conv(x: jax.Array, w: jax.Array, pad: int) -> jax.Array:
    """XLA's stride-1 convolution, NHWC × HWIO, ``pad`` on each side of both spatial axes."""
    return jax.lax.conv_general_dilated(
        x, w, (1, 1), [(pad, pad), (pad, pad)], dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _windows(padded: jax.Array, kh: int, kw: int, h: int, w: int) -> list[jax.Array]:
    """The kh·kw shifted [B, h, w, C] windows of ``padded``, tap (i, j) in row-major order."""
    return [padded[:, i : i + h, j : j + w, :] for i in range(kh) for j in range(kw)]


def _contract_rows(a: jax.Array, b: jax.Array) -> jax.Array:
    """aᵀ b for a [N, m] and b [N, n] (the rows contracted), accumulated in float32."""
    return jnp.dot(a.T, b, preferred_element_type=jnp.float32)


def input_gradient(form: str, x_shape: tuple[int, ...], w: jax.Array, g: jax.Array, pad: int) -> jax.Array:
    """dL/dx of ``xla_conv(x, w, pad)`` for the output's gradient ``g``, in ``form``."""
    if form == "xla":
        x = jnp.zeros(x_shape, g.dtype)
        return jax.vjp(lambda x_: xla_conv(x_, w, pad), x)[1](g)[0]
    kh, kw, cin, cout = w.shape
    _, h, wd, _ = x_shape
    edge_h, edge_w = kh - 1 - pad, kw - 1 - pad
    widths = [(0, 0, 0), (edge_h, edge_h, 0), (edge_w, edge_w, 0), (0, 0, 0)]
    gp = jax.lax.pad(g, jnp.zeros((), g.dtype), widths)  # a negative edge crops
    flipped = w[::-1, ::-1]  # tap (i, j) of g_pad meets w[k-1-i, k-1-j]
    windows = _windows(gp, kh, kw, h, wd)
    if form == "per_tap":
        out = None
        for t, window in enumerate(windows):
            part = jnp.dot(
                window.reshape(-1, cout), flipped[t // kw, t % kw].T, preferred_element_type=jnp.float32
            )
            out = part if out is None else out + part
        assert out is not None, "a kernel has at least one tap"
    elif form == "im2col":
        patches = jnp.concatenate(windows, axis=-1).reshape(-1, kh * kw * cout)
        matrix = flipped.transpose(0, 1, 3, 2).reshape(kh * kw * cout, cin)
        out = jnp.dot(patches, matrix, preferred_element_type=jnp.float32)
    else:
        raise ValueError(f"input gradient form {form!r} is not one of {INPUT_FORMS}")
    return out.reshape(x_shape).astype(g.dtype)


def weight_gradient(form: str, x: jax.Array, w_shape: tuple[int, ...], g: jax.Array, pad: int) -> jax.Array:
    """dL/dw of ``xla_conv(x, w, pad)`` for the output's gradient ``g``, in ``form``."""
    if form == "xla":
        w = jnp.zeros(w_shape, x.dtype)
        return jax.vjp(lambda w_: xla_conv(x, w_, pad), w)[1](g)[0]
    kh, kw, cin, cout = w_shape
    _, h, wd, _ = g.shape
    xp = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0))) if pad else x
    rows = g.reshape(-1, cout)
    windows = _windows(xp, kh, kw, h, wd)
    if form == "per_tap":
        dw = jnp.stack([_contract_rows(window.reshape(-1, cin), rows) for window in windows])
    elif form == "im2col":
        dw = _contract_rows(jnp.concatenate(windows, axis=-1).reshape(-1, kh * kw * cin), rows)
    else:
        raise ValueError(f"weight gradient form {form!r} is not one of {WEIGHT_FORMS}")
    return dw.reshape(w_shape).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _convolve(x: jax.Array, w: jax.Array, pad: int, input_form: str, weight_form: str) -> jax.Array:
    return xla_conv(x, w, pad)


def _forward(x: jax.Array, w: jax.Array, pad: int, input_form: str, weight_form: str):
    return xla_conv(x, w, pad), (x, w)


def _backward(pad: int, input_form: str, weight_form: str, residuals, g: jax.Array):
    x, w = residuals
    return input_gradient(input_form, x.shape, w, g, pad), weight_gradient(weight_form, x, w.shape, g, pad)


_convolve.defvjp(_forward, _backward)


def convolve(
    x: jax.Array, w: jax.Array, pad: int, input_form: str = "xla", weight_form: str = "xla"
) -> jax.Array:
    """``xla_conv(x, w, pad)`` whose reverse mode takes its input and weight gradients in the forms
    named (``INPUT_FORMS``, ``WEIGHT_FORMS``); both ``xla``: XLA's convolution itself (forward-mode
    differentiation too). Raises ValueError for an unknown form."""
    if input_form not in INPUT_FORMS:
        raise ValueError(f"input gradient form {input_form!r} is not one of {INPUT_FORMS}")
    if weight_form not in WEIGHT_FORMS:
        raise ValueError(f"weight gradient form {weight_form!r} is not one of {WEIGHT_FORMS}")
    if input_form == "xla" and weight_form == "xla":
        return xla_conv(x, w, pad)
    return _convolve(x, w, pad, input_form, weight_form)


__all__ = ["INPUT_FORMS", "WEIGHT_FORMS", "convolve", "input_gradient", "weight_gradient", "xla_conv"]
