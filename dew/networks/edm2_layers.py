"""The magnitude-preserving layers of EDM2 (Karras et al. 2024, "Analyzing and Improving the
Training Dynamics of Diffusion Models"), exactly as NVlabs/edm2 ``training/networks_edm2.py``
defines them, in haiku and channels-last.

Layouts are dew's own (the reference's state_dict converts by transposition only,
``dew.networks.edm2_weights``):

* activations NHWC; ``MPConv`` weights [k, k, in, out] (reference [out, in, k, k]) and, for the
  fully-connected case, [in, out] (reference [out, in]);
* ``normalize`` of a weight reduces over every axis but the last (the output channel), the
  reference's "all dimensions except the first".

Forced weight normalisation (Eq. 66) has two halves. The forward pass always uses
``normalize(w)`` (the reference's "traditional weight normalization"), so gradients are those
of the normalised weight. The reference also overwrites the stored weight with ``normalize(w)``
in every training forward; a haiku forward is pure, so that half is ``project_weights`` below,
which the ``edm2`` objective returns from ``Objective.project`` and the trainer applies to the
parameters each step differentiates (``dew.training.steps``).

``MPFourier``'s ``freqs`` and ``phases`` are buffers in the reference (random, never trained).
Here they are haiku parameters read through ``stop_gradient``: their gradient is exactly zero,
so Adam (whose update of a zero-gradient, zero-moment leaf is 0) and the EMA leave them as
initialised. ``BUFFER_NAMES`` lets parameter counts tell them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew.networks.edm_layers import conv, downsample, upsample

NORMALIZE_EPS = 1e-4
"""``normalize``'s default ε in the reference."""

MP_SILU_SCALE = 0.596
"""E[silu(x)²]^½ for x ~ N(0, 1), rounded as the reference has it (Eq. 81)."""

BUFFER_NAMES = ("freqs", "phases")
"""Parameter names that are buffers (not ``parameters()``) in the reference."""


def normalize(x: jax.Array, axes: Sequence[int] | None = None, eps: float = NORMALIZE_EPS) -> jax.Array:
    """x / (ε + ‖x‖ √(n_norm / n_x)) over ``axes`` (default: all but the last), in float32 norm
    (the reference's ``normalize``: unit magnitude per element, i.e. ‖x‖ = √(elements reduced))."""
    if axes is None:
        axes = tuple(range(x.ndim - 1))
    axes = tuple(a % x.ndim for a in axes)
    norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=axes, keepdims=True))
    reduced = int(np.prod([x.shape[a] for a in axes]))
    norm = eps + norm * float(np.sqrt(1.0 / reduced))
    return x / norm.astype(x.dtype)


def mp_silu(x: jax.Array) -> jax.Array:
    """Magnitude-preserving SiLU (Eq. 81): silu(x) / 0.596."""
    return jax.nn.silu(x) / MP_SILU_SCALE


def mp_sum(a: jax.Array, b: jax.Array, t: float = 0.5) -> jax.Array:
    """Magnitude-preserving sum (Eq. 88): lerp(a, b, t) / √((1 − t)² + t²)."""
    return (a + t * (b - a)) / float(np.sqrt((1 - t) ** 2 + t**2))


def mp_cat(a: jax.Array, b: jax.Array, axis: int = -1, t: float = 0.5) -> jax.Array:
    """Magnitude-preserving concatenation (Eq. 103) along ``axis`` (channels, NHWC)."""
    na, nb = a.shape[axis], b.shape[axis]
    scale = np.sqrt((na + nb) / ((1 - t) ** 2 + t**2))
    wa = float(scale / np.sqrt(na) * (1 - t))
    wb = float(scale / np.sqrt(nb) * t)
    return jnp.concatenate([wa * a, wb * b], axis=axis)


def resample(x: jax.Array, resample_filter: Sequence[float] = (1, 1), mode: str = "keep") -> jax.Array:
    """The reference's ``resample``: 'keep', or a stride-2 'down'/'up' with the separable FIR
    filter f/Σf (padding (len(f) − 1) // 2), NHWC."""
    if mode == "keep":
        return x
    f = np.asarray(resample_filter, np.float64)
    if f.ndim != 1 or len(f) % 2 != 0:
        raise ValueError(f"resample_filter must be a 1D filter of even length, got {tuple(resample_filter)}")
    pad = (len(f) - 1) // 2
    if mode == "down":
        return downsample(x, resample_filter, pad)
    if mode == "up":
        return upsample(x, resample_filter, pad)
    raise ValueError(f"resample mode={mode!r} is unknown: expected one of ('keep', 'down', 'up')")


def project_weights(params: hk.Params, is_mpconv: Callable[[str], bool]) -> hk.Params:
    """Forced weight normalisation of the stored weights (Eq. 66): every ``weight`` leaf of a
    module whose name ``is_mpconv`` accepts becomes ``normalize(weight)``; the rest is unchanged.
    Pure; the reference's ``self.weight.copy_(normalize(w))`` in its training forward."""
    out = {}
    for module, leaves in params.items():
        if is_mpconv(module):
            out[module] = {k: normalize(v) if k == "weight" else v for k, v in leaves.items()}
        else:
            out[module] = leaves
    if isinstance(params, dict):
        return out
    # The params' own mapping type (haiku's FlatMap, ...), built from a dict: the checker sees only
    # the abstract Mapping, whose constructor takes no arguments.
    return cast(Any, type(params))(out)


class MPFourier(hk.Module):
    """Magnitude-preserving Fourier features (Eq. 75): √2 cos(x ⊗ freqs + phases), with
    freqs = 2π N(0, 1) · bandwidth and phases = 2π U[0, 1) drawn at init and never trained."""

    def __init__(self, num_channels: int, bandwidth: float = 1.0, name: str | None = None):
        super().__init__(name=name)
        self.num_channels, self.bandwidth = num_channels, float(bandwidth)

    def __call__(self, x: jax.Array) -> jax.Array:
        n, bw = self.num_channels, self.bandwidth

        def freqs_init(shape, dtype):
            return 2 * np.pi * jax.random.normal(hk.next_rng_key(), shape, dtype) * bw

        def phases_init(shape, dtype):
            return 2 * np.pi * jax.random.uniform(hk.next_rng_key(), shape, dtype)

        freqs = jax.lax.stop_gradient(hk.get_parameter("freqs", [n], jnp.float32, freqs_init))
        phases = jax.lax.stop_gradient(hk.get_parameter("phases", [n], jnp.float32, phases_init))
        y = x.astype(jnp.float32)[:, None] * freqs[None, :] + phases[None, :]
        return (jnp.cos(y) * np.sqrt(2)).astype(x.dtype)


class MPConv(hk.Module):
    """Magnitude-preserving convolution or fully-connected layer (Eq. 47) with forced weight
    normalisation (Eq. 66): y = x ⋆ (gain · normalize(w) / √fan_in).

    ``kernel`` () is fully connected (x [..., in] → [..., out]); (k, k) a stride-1 convolution
    with padding k // 2 (NHWC). The weight is initialised N(0, 1), as ``torch.randn``.
    """

    def __init__(self, out_channels: int, kernel: Sequence[int], name: str | None = None):
        super().__init__(name=name)
        self.out_channels, self.kernel = out_channels, tuple(kernel)
        if self.kernel and (len(self.kernel) != 2 or self.kernel[0] != self.kernel[1]):
            raise ValueError(f"MPConv: kernel must be () or (k, k), got {self.kernel}")

    def __call__(self, x: jax.Array, gain: jax.Array | float = 1.0) -> jax.Array:
        in_channels = x.shape[-1]
        shape = [*self.kernel, in_channels, self.out_channels]
        w = hk.get_parameter("weight", shape, jnp.float32, hk.initializers.RandomNormal(1.0))
        w = normalize(w)  # traditional weight normalisation
        fan_in = int(np.prod(shape[:-1]))
        w = w * (gain / np.sqrt(fan_in))  # magnitude-preserving scaling
        w = w.astype(x.dtype)
        if not self.kernel:
            return jnp.dot(x, w)
        return conv(x, w, self.kernel[0] // 2)
