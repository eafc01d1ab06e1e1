"""The building blocks of NVlabs/edm's U-Nets (``training/networks.py``), in haiku, channels-last.

Every layer keeps the reference's parameter names (``weight``, ``bias``; ``freqs`` for the
NCSN++ Fourier frequencies) and its initialisation rule (``weight_init``: xavier/kaiming,
uniform/normal, from the PyTorch fan-in/fan-out, times ``init_weight``/``init_bias``), so
parameter counts and initial statistics equal the reference's. Layouts are dew's own:

* activations NHWC; convolution weights [k, k, in, out]; linear weights [in, out];
* the attention ``qkv`` projection's output channels are ordered (q|k|v, head, channel)
  (the reference interleaves them as (head, channel, q|k|v); ``dew.networks.edm_weights``
  converts).

Resampling is the reference's: a separable FIR filter ``f`` (normalised to sum 1), applied as a
depthwise stride-2 convolution going down and as a ×4-scaled stride-2 transposed convolution
going up. It is expressed with strided slices and adds (no depthwise convolution kernel), and
the DDPM++/ADM box filter [1, 1] becomes a 2×2 mean and a nearest-neighbour repeat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import kernels
from dew.networks import conv_forms, materialize

INIT_MODES = ("xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal")


class Init:
    """The reference's ``weight_init(shape, mode, fan_in, fan_out) * gain`` as a haiku initializer."""

    def __init__(self, mode: str, fan_in: int, fan_out: int, gain: float = 1.0):
        if mode not in INIT_MODES:
            raise ValueError(f"init_mode={mode!r} is unknown: expected one of {INIT_MODES}")
        self.mode, self.fan_in, self.fan_out, self.gain = mode, fan_in, fan_out, float(gain)

    def __call__(self, shape: Sequence[int], dtype) -> jax.Array:
        if self.gain == 0.0:
            return jnp.zeros(shape, dtype)
        key = hk.next_rng_key()
        if self.mode.endswith("uniform"):
            base = jax.random.uniform(key, shape, dtype, -1.0, 1.0)
            bound = 6 / (self.fan_in + self.fan_out) if self.mode == "xavier_uniform" else 3 / self.fan_in
        else:
            base = jax.random.normal(key, shape, dtype)
            bound = 2 / (self.fan_in + self.fan_out) if self.mode == "xavier_normal" else 1 / self.fan_in
        return base * (math.sqrt(bound) * self.gain)


def init_args(init_mode: str = "kaiming_normal", init_weight: float = 1.0, init_bias: float = 0.0) -> dict:
    """The reference's ``init=dict(...)`` keyword set, validated."""
    if init_mode not in INIT_MODES:
        raise ValueError(f"init_mode={init_mode!r} is unknown: expected one of {INIT_MODES}")
    return {"init_mode": init_mode, "init_weight": init_weight, "init_bias": init_bias}


class Linear(hk.Module):
    """x @ weight + bias, weight [in, out]."""

    def __init__(
        self, out_features: int, bias: bool = True, *, init: dict | None = None, name: str | None = None
    ):
        super().__init__(name=name)
        self.out_features, self.use_bias = out_features, bias
        self.init = init_args(**(init or {}))

    def __call__(self, x: jax.Array) -> jax.Array:
        fan_in, fan_out = x.shape[-1], self.out_features
        mode, gw, gb = self.init["init_mode"], self.init["init_weight"], self.init["init_bias"]
        w = hk.get_parameter("weight", [fan_in, fan_out], x.dtype, Init(mode, fan_in, fan_out, gw))
        x = jnp.dot(x, w)
        if self.use_bias:
            x = x + hk.get_parameter("bias", [fan_out], x.dtype, Init(mode, fan_in, fan_out, gb))
        return x


# --- resampling ----------------------------------------------------------------------------------
def _taps(resample_filter: Sequence[float]) -> np.ndarray:
    f = np.asarray(resample_filter, np.float64)
    if f.ndim != 1 or f.size < 1 or f.sum() == 0:
        raise ValueError(
            f"resample_filter must be a non-empty 1D filter with a nonzero sum, got {resample_filter}"
        )
    return f / f.sum()


def _down_1d(x: jax.Array, taps: np.ndarray, pad: int, axis: int) -> jax.Array:
    """out[i] = Σ_k taps[k] x_padded[2i + k] along ``axis`` (a stride-2 correlation)."""
    k = taps.size
    if pad:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (pad, pad)
        x = jnp.pad(x, widths)
    n_out = (x.shape[axis] - k) // 2 + 1
    out = None
    for j, t in enumerate(taps):
        part = jax.lax.slice_in_dim(x, j, j + 2 * (n_out - 1) + 1, stride=2, axis=axis) * float(t)
        out = part if out is None else out + part
    assert out is not None, "a resampling filter has at least one tap"
    return out


def _up_1d(x: jax.Array, taps: np.ndarray, pad: int, axis: int) -> jax.Array:
    """The stride-2 transposed correlation with 2·taps: out[o] = Σ_i x[i] 2 taps[o + pad − 2i]."""
    k, n = taps.size, x.shape[axis]
    zeros = jnp.zeros_like(x)
    dilated = jnp.stack([x, zeros], axis=axis + 1)
    shape = list(x.shape)
    shape[axis] = 2 * n
    dilated = jax.lax.slice_in_dim(dilated.reshape(shape), 0, 2 * n - 1, axis=axis)
    edge = k - 1 - pad
    if edge < 0:
        raise ValueError(f"resampling padding {pad} exceeds the filter length {k} - 1")
    widths = [(0, 0)] * x.ndim
    widths[axis] = (edge, edge)
    dilated = jnp.pad(dilated, widths)
    n_out = 2 * n - 2 - 2 * pad + k
    out = None
    for r in range(k):
        part = jax.lax.slice_in_dim(dilated, r, r + n_out, axis=axis) * float(2 * taps[k - 1 - r])
        out = part if out is None else out + part
    assert out is not None, "a resampling filter has at least one tap"
    return out


def downsample(x: jax.Array, resample_filter: Sequence[float], pad: int) -> jax.Array:
    """The reference's depthwise stride-2 convolution with outer(f, f)/sum(f)², NHWC."""
    taps = _taps(resample_filter)
    if taps.size == 2 and taps[0] == taps[1] and pad == 0:  # [1, 1]: a 2×2 mean
        b, h, w, c = x.shape
        return x.reshape(b, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))
    return _down_1d(_down_1d(x, taps, pad, 1), taps, pad, 2)


def upsample(x: jax.Array, resample_filter: Sequence[float], pad: int) -> jax.Array:
    """The reference's stride-2 transposed convolution with 4·outer(f, f)/sum(f)², NHWC."""
    taps = _taps(resample_filter)
    if taps.size == 2 and taps[0] == taps[1] and pad == 0:  # [1, 1]: nearest neighbour
        b, h, w, c = x.shape
        x = jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c))
        return x.reshape(b, 2 * h, 2 * w, c)
    return _up_1d(_up_1d(x, taps, pad, 1), taps, pad, 2)


def conv(x: jax.Array, w: jax.Array, pad: int) -> jax.Array:
    """Stride-1 2D convolution, NHWC × [k, k, in, out]; a 1×1 kernel is a matmul.

    Its input and weight gradients take the forms the platform's choice names for its shape class
    (``dew.kernels.convolution_forms``, set by ``dew.runtime``: XLA's own, or a per-tap or im2col
    sum of matmuls, ``dew.networks.conv_forms``, where a run recorded one);
    without a choice, XLA's.

    On XLA:CPU the input, and in reverse mode the output's gradient, are each computed once into
    their own buffer (``dew.networks.materialize``) instead of being re-fused into every use; the
    values and derivatives are unchanged.
    """
    if w.shape[0] == 1 and w.shape[1] == 1 and pad == 0:
        return jnp.dot(x, w[0, 0])
    shape_class = (x.shape[1], x.shape[2], w.shape[2], w.shape[3], w.shape[0], pad)
    input_form, weight_form = kernels.convolution_forms(x.shape[1] * x.shape[2], shape_class)
    # XLA:CPU would re-fuse the elementwise chain that produced x (and the one producing the
    # output's gradient) into the layout transposes feeding the weight gradient, recomputing it
    # there in transposed order; computed once, the 16×16 EDM step is ~10 % faster
    # (dew.networks.materialize; benchmarks/RESULTS.md). The token is w's, so the
    # mark holds when only w is differentiated.
    return materialize.marked(
        lambda v: conv_forms.convolve(v, w, pad, input_form, weight_form), x, w[0, 0, 0, 0]
    )


_xla_conv = conv_forms.xla_conv


def _conv_tap_weight_grad(x: jax.Array, w: jax.Array, pad: int) -> jax.Array:
    """XLA's convolution whose weight gradient is computed one kernel tap at a time (forward and
    input gradient XLA's own; ``dew.networks.conv_forms``). XLA:CPU computes the weight gradient
    as a convolution whose kernel is the whole output gradient, which on some CPUs is ~8× slower
    at 32×32 (``benchmarks/RESULTS.md``); the two agree to float32 summation order."""
    return conv_forms.convolve(x, w, pad, "xla", "per_tap")


class Conv2d(hk.Module):
    """The reference's ``Conv2d``: an optional up/down resampling and a k×k convolution.

    ``kernel=0`` is a parameter-free resampling. ``fused_resample`` pads the convolution by the
    filter's half-width and resamples after it (down) or before it (up), as the reference does.
    """

    def __init__(
        self,
        out_channels: int,
        kernel: int,
        bias: bool = True,
        up: bool = False,
        down: bool = False,
        resample_filter: Sequence[float] = (1, 1),
        fused_resample: bool = False,
        *,
        init: dict | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        if up and down:
            raise ValueError("Conv2d: up and down are exclusive")
        self.out_channels, self.kernel, self.use_bias = out_channels, kernel, bias
        self.up, self.down, self.fused = up, down, fused_resample
        self.resample_filter = tuple(resample_filter)
        self.init = init_args(**(init or {}))

    def __call__(self, x: jax.Array) -> jax.Array:
        cin, k = x.shape[-1], self.kernel
        w = b = None
        if k:
            mode = self.init["init_mode"]
            fan_in, fan_out = cin * k * k, self.out_channels * k * k
            w = hk.get_parameter(
                "weight",
                [k, k, cin, self.out_channels],
                x.dtype,
                Init(mode, fan_in, fan_out, self.init["init_weight"]),
            )
            if self.use_bias:
                b = hk.get_parameter(
                    "bias", [self.out_channels], x.dtype, Init(mode, fan_in, fan_out, self.init["init_bias"])
                )
        w_pad = k // 2
        f_pad = (len(self.resample_filter) - 1) // 2
        f = self.resample_filter
        if self.fused and self.up and w is not None:
            x = conv(upsample(x, f, w_pad + f_pad), w, 0)
        elif self.fused and self.down and w is not None:
            x = downsample(conv(x, w, w_pad + f_pad), f, 0)
        else:
            if self.up:
                x = upsample(x, f, f_pad)
            if self.down:
                x = downsample(x, f, f_pad)
            if w is not None:
                x = conv(x, w, w_pad)
        if b is not None:
            x = x + b
        return x


def group_count(channels: int, num_groups: int = 32, min_channels_per_group: int = 4) -> int:
    """The reference's ``min(num_groups, channels // min_channels_per_group)``, which must divide."""
    groups = min(num_groups, channels // min_channels_per_group)
    if groups < 1 or channels % groups:
        raise ValueError(
            f"GroupNorm: {channels} channels cannot be split into min(32, {channels}//4) = {groups} groups; "
            "use channel counts that are multiples of 4 and of the group count"
        )
    return groups


def group_mean(x: jax.Array, groups: int) -> jax.Array:
    """[B, P, C] -> [B, 1, groups, 1]: the mean over the P positions and each group's C / groups
    channels, as two reductions of one axis each, the positions first.

    The same mean as one reduction over both axes (float32 reassociation only), but XLA:CPU
    runs the one-axis form several times faster: a group norm + SiLU at 32×32×64, batch 32, one
    device on a 2-core AMD EPYC (AVX2) takes 1.9 against 13.1 ms forward and 31 against 36 ms
    with its gradient (``benchmarks/RESULTS.md``)."""
    b, _, c = x.shape
    per_channel = jnp.mean(x, axis=1)  # [B, C]
    return jnp.mean(per_channel.reshape(b, groups, c // groups), axis=-1).reshape(b, 1, groups, 1)


class GroupNorm(hk.Module):
    """Group normalisation over (H, W, channels of a group), NHWC, with per-channel weight/bias."""

    def __init__(
        self,
        eps: float = 1e-5,
        num_groups: int = 32,
        min_channels_per_group: int = 4,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.eps, self.num_groups, self.min_per_group = eps, num_groups, min_channels_per_group

    def __call__(self, x: jax.Array) -> jax.Array:
        b, h, w, c = x.shape
        g = group_count(c, self.num_groups, self.min_per_group)
        weight = hk.get_parameter("weight", [c], x.dtype, jnp.ones)
        bias = hk.get_parameter("bias", [c], x.dtype, jnp.zeros)

        def normalise(x: jax.Array) -> jax.Array:
            # In float32 whatever the compute dtype (docs/precision.md): the statistics of a
            # bfloat16 / float16 group would lose the mean's digits; the result is cast back.
            xs = x.astype(jnp.float32).reshape(b, h * w, c)
            centred = xs.reshape(b, h * w, g, c // g) - group_mean(xs, g)
            var = group_mean(jnp.square(centred).reshape(b, h * w, c), g)
            y = (centred * jax.lax.rsqrt(var + self.eps)).reshape(b, h, w, c)
            return (y * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)

        # The input feeds two reductions and the normalisation, the output's gradient as many
        # uses again: computed once each on XLA:CPU instead of re-fused into every one (the
        # 16×16 EDM step compiles ~10 % less CPU time; dew.networks.materialize).
        return materialize.marked(normalise, x, weight[0])


# --- noise embeddings ----------------------------------------------------------------------------
def positional_embedding(
    x: jax.Array, num_channels: int, max_positions: int = 10000, endpoint: bool = False
) -> jax.Array:
    """[B] -> [B, num_channels]: [cos(x f), sin(x f)] with f = (1/max_positions)^(i / (n/2 − endpoint))."""
    half = num_channels // 2
    denom = half - (1 if endpoint else 0)
    if denom < 1:
        raise ValueError(
            f"positional embedding needs num_channels >= {4 if endpoint else 2}, got {num_channels}"
        )
    freqs = (1.0 / max_positions) ** (jnp.arange(half, dtype=jnp.float32) / denom)
    angles = x.astype(jnp.float32)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=1)


class FourierEmbedding(hk.Module):
    """NCSN++'s random Fourier features, [B] -> [B, n]: [cos(2π x f), sin(2π x f)], f ~ N(0, scale²).

    ``freqs`` is a fixed buffer in the reference. Here it is a parameter named ``freqs`` whose
    gradient is stopped, so a plain Adam (no weight decay) never moves it; it is not counted as a
    trainable parameter (``dew.networks.edm_weights.BUFFERS``).
    """

    def __init__(self, num_channels: int, scale: float = 16.0, name: str | None = None):
        super().__init__(name=name)
        self.num_channels, self.scale = num_channels, scale

    def __call__(self, x: jax.Array) -> jax.Array:
        def init(shape, dtype):
            return jax.random.normal(hk.next_rng_key(), shape, dtype) * self.scale

        freqs = jax.lax.stop_gradient(hk.get_parameter("freqs", [self.num_channels // 2], jnp.float32, init))
        angles = x.astype(jnp.float32)[:, None] * (2 * np.pi * freqs)[None, :]
        return jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=1)
