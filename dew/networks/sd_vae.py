"""Stable Diffusion's ``AutoencoderKL`` (the VAE of ``stabilityai/sd-vae-ft-mse``) in haiku.

The architecture is diffusers' ``AutoencoderKL`` with ``down_block_types`` all
``DownEncoderBlock2D``, ``up_block_types`` all ``UpDecoderBlock2D``, SiLU, ``norm_num_groups``
groups, mid-block attention, ``quant_conv`` and ``post_quant_conv`` (``models/autoencoders/
autoencoder_kl.py``, ``vae.py``, ``resnet.py``, ``downsampling.py``, ``upsampling.py``,
``unets/unet_2d_blocks.py``); sd-vae-ft-mse is ``SD_VAE``: channels (128, 256, 512, 512),
two layers per block, 4 latent channels, 32 groups. Every GroupNorm has ε = 1e-6.

- ``ResnetBlock2D`` (no time embedding): x' = conv2(silu(norm2(conv1(silu(norm1 x))))) plus x,
  through a 1×1 ``conv_shortcut`` when the channel count changes.
- ``Downsample2D`` (``padding=0``): zero-pad one row at the bottom and one column at the right,
  then a 3×3 stride-2 convolution. ``Upsample2D``: nearest-neighbour ×2, then a 3×3 convolution.
- Mid-block ``Attention`` (one head of all channels): x + to_out(softmax(q kᵀ/√C) v) with q, k, v
  linear maps of the group-normed pixels as tokens.
- Encoder: conv_in, down blocks (a downsample after all but the last), mid block (resnet,
  attention, resnet), norm, SiLU, conv_out to 2·latent channels, then ``quant_conv`` (1×1):
  the moments. ``DiagonalGaussianDistribution``: mean, logvar = split; logvar clipped to
  [−30, 20]; std = exp(logvar / 2).
- Decoder: ``post_quant_conv`` (1×1), conv_in, mid block, up blocks in reversed channel order with
  layers + 1 resnets (an upsample after all but the last), norm, SiLU, conv_out.

Images are NHWC here (diffusers: NCHW); the value range is whatever the caller feeds (EDM2 feeds
[0, 1], see ``dew.encoding.stability_vae``). Parameters are named after the diffusers state_dict
keys: ``encoder.down_blocks.0.resnets.1.conv1`` is the haiku module
``encoder__down_blocks__0__resnets__1__conv1`` (``haiku_name``), with ``w`` (HWIO) and ``b``, or
``scale``/``offset`` for a GroupNorm; ``params_from_torch_names`` maps a state_dict.

Called on bfloat16 parameters and inputs (``config.precision.compute``, the ``autoencoder``
objective) it computes in bfloat16, except each GroupNorm (statistics, normalisation and
affine in float32, the result cast back) and the attention's logits and softmax (float32, the
weights cast back before the product with v), as ``docs/precision.md`` states for EDM's
networks. On float32 it is float32 throughout.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

GROUP_NORM_EPS = 1e-6
LOGVAR_RANGE = (-30.0, 20.0)  # DiagonalGaussianDistribution's clamp
_HP = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class VAEConfig:
    """The shape of an ``AutoencoderKL``; the defaults are sd-vae-ft-mse's ``config.json``."""

    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 4
    norm_num_groups: int = 32
    in_channels: int = 3
    out_channels: int = 3

    def __post_init__(self):
        bad = [c for c in self.block_out_channels if c % self.norm_num_groups]
        if bad:
            raise ValueError(
                f"block_out_channels={self.block_out_channels}: {bad} not divisible by "
                f"norm_num_groups={self.norm_num_groups}"
            )

    @property
    def downsampling(self) -> int:
        """Pixels per latent along each axis: 2^(number of blocks − 1)."""
        return 2 ** (len(self.block_out_channels) - 1)


SD_VAE = VAEConfig()


def haiku_name(torch_name: str) -> str:
    """The haiku module of a diffusers module path: dots become double underscores
    (``encoder.down_blocks.0.conv1`` → ``encoder__down_blocks__0__conv1``; haiku module names
    are identifiers, and no diffusers name holds ``__``)."""
    return torch_name.replace(".", "__")


def torch_name(haiku_module: str) -> str:
    """The inverse of ``haiku_name``."""
    return haiku_module.replace("__", ".")


class _Leaf(hk.Module):
    """One diffusers module's parameters, under its ``haiku_name``."""

    def __call__(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, jax.Array]:
        return {k: hk.get_parameter(k, s, jnp.float32, jnp.zeros) for k, s in shapes.items()}


def _params(scope: str, **shapes: tuple[int, ...]) -> dict[str, jax.Array]:
    return _Leaf(name=haiku_name(scope))(shapes)


def conv(scope: str, x: jax.Array, channels: int, kernel: int, stride: int = 1, padding=None) -> jax.Array:
    """``nn.Conv2d`` (bias, zero padding ``kernel // 2`` unless given as ((top, bottom), (left, right)))."""
    p = _params(scope, w=(kernel, kernel, x.shape[-1], channels), b=(channels,))
    w, b = p["w"], p["b"]
    pad = padding if padding is not None else [(kernel // 2, kernel // 2)] * 2
    y = jax.lax.conv_general_dilated(
        x, w, (stride, stride), pad, dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=_HP
    )
    return y + b


def group_norm(scope: str, x: jax.Array, groups: int) -> jax.Array:
    """``nn.GroupNorm(groups, C, eps=1e-6)``: statistics over H, W and the group's channels
    (biased variance), then the per-channel affine map."""
    n, h, w, c = x.shape
    g = x.astype(jnp.float32).reshape(n, h, w, groups, c // groups)  # float32 under every policy
    mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=(1, 2, 4), keepdims=True)
    g = (g - mean) * jax.lax.rsqrt(var + GROUP_NORM_EPS)
    p = _params(scope, scale=(c,), offset=(c,))
    return (g.reshape(n, h, w, c) * p["scale"] + p["offset"]).astype(x.dtype)


def resnet(scope: str, x: jax.Array, channels: int, groups: int) -> jax.Array:
    """``ResnetBlock2D`` without a time embedding (dropout 0, output scale 1)."""
    h = conv(f"{scope}.conv1", jax.nn.silu(group_norm(f"{scope}.norm1", x, groups)), channels, 3)
    h = conv(f"{scope}.conv2", jax.nn.silu(group_norm(f"{scope}.norm2", h, groups)), channels, 3)
    if x.shape[-1] != channels:
        x = conv(f"{scope}.conv_shortcut", x, channels, 1)
    return x + h


def attention(scope: str, x: jax.Array, groups: int) -> jax.Array:
    """The mid-block ``Attention`` (one head, residual, ``rescale_output_factor`` 1)."""
    n, h, w, c = x.shape
    t = group_norm(f"{scope}.group_norm", x, groups).reshape(n, h * w, c)

    def linear(name: str, v: jax.Array) -> jax.Array:
        p = _params(f"{scope}.{name}", w=(c, c), b=(c,))
        return jnp.einsum("ntc,cd->ntd", v, p["w"], precision=_HP) + p["b"]

    q, k, v = linear("to_q", t), linear("to_k", t), linear("to_v", t)
    f32 = jnp.float32  # the logits and softmax in float32 under every policy
    logits = jnp.einsum("ntc,nsc->nts", q, k, precision=_HP, preferred_element_type=f32) * c**-0.5
    weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum("nts,nsc->ntc", weights, v, precision=_HP)
    return x + linear("to_out.0", out).reshape(n, h, w, c)


def mid_block(scope: str, x: jax.Array, groups: int) -> jax.Array:
    c = x.shape[-1]
    x = resnet(f"{scope}.resnets.0", x, c, groups)
    x = attention(f"{scope}.attentions.0", x, groups)
    return resnet(f"{scope}.resnets.1", x, c, groups)


def encode_moments(x: jax.Array, config: VAEConfig = SD_VAE) -> jax.Array:
    """``AutoencoderKL._encode`` (encoder + ``quant_conv``): [N, H, W, in] → [N, H/f, W/f, 2·latent]."""
    chex.assert_rank(x, 4)
    f = config.downsampling
    if x.shape[1] % f or x.shape[2] % f:
        raise ValueError(f"image size {x.shape[1]}x{x.shape[2]} must be a multiple of {f}")
    g, chans = config.norm_num_groups, config.block_out_channels
    h = conv("encoder.conv_in", x, chans[0], 3)
    for i, c in enumerate(chans):
        for j in range(config.layers_per_block):
            h = resnet(f"encoder.down_blocks.{i}.resnets.{j}", h, c, g)
        if i < len(chans) - 1:
            h = conv(f"encoder.down_blocks.{i}.downsamplers.0.conv", h, c, 3, 2, padding=[(0, 1), (0, 1)])
    h = mid_block("encoder.mid_block", h, g)
    h = jax.nn.silu(group_norm("encoder.conv_norm_out", h, g))
    h = conv("encoder.conv_out", h, 2 * config.latent_channels, 3)
    moments = conv("quant_conv", h, 2 * config.latent_channels, 1)
    chex.assert_shape(moments, (x.shape[0], x.shape[1] // f, x.shape[2] // f, 2 * config.latent_channels))
    return moments


def mean_and_std(moments: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``DiagonalGaussianDistribution(moments)``'s ``mean`` and ``std`` (logvar clipped to [−30, 20])."""
    mean, logvar = jnp.split(moments, 2, axis=-1)
    return mean, jnp.exp(0.5 * jnp.clip(logvar, *LOGVAR_RANGE))


def decode(z: jax.Array, config: VAEConfig = SD_VAE) -> jax.Array:
    """``AutoencoderKL._decode`` (``post_quant_conv`` + decoder): [N, h, w, latent] → [N, h·f, w·f, out]."""
    chex.assert_rank(z, 4)
    chex.assert_axis_dimension(z, 3, config.latent_channels)
    g, chans = config.norm_num_groups, tuple(reversed(config.block_out_channels))
    h = conv("post_quant_conv", z, config.latent_channels, 1)
    h = conv("decoder.conv_in", h, chans[0], 3)
    h = mid_block("decoder.mid_block", h, g)
    for i, c in enumerate(chans):
        for j in range(config.layers_per_block + 1):
            h = resnet(f"decoder.up_blocks.{i}.resnets.{j}", h, c, g)
        if i < len(chans) - 1:
            h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)  # F.interpolate(scale_factor=2, "nearest")
            h = conv(f"decoder.up_blocks.{i}.upsamplers.0.conv", h, c, 3)
    h = jax.nn.silu(group_norm("decoder.conv_norm_out", h, g))
    return conv("decoder.conv_out", h, config.out_channels, 3)


@functools.cache
def encoder_network(config: VAEConfig = SD_VAE) -> hk.Transformed:
    """haiku-transformed ``encode_moments`` (``apply(params, None, x)``; also inits the encoder half)."""
    return hk.without_apply_rng(hk.transform(functools.partial(encode_moments, config=config)))


@functools.cache
def decoder_network(config: VAEConfig = SD_VAE) -> hk.Transformed:
    """haiku-transformed ``decode``."""
    return hk.without_apply_rng(hk.transform(functools.partial(decode, config=config)))


def expected_shapes(config: VAEConfig = SD_VAE) -> dict[str, dict[str, tuple[int, ...]]]:
    """Every haiku module → parameter → shape, for both halves (from abstract inits)."""
    f = config.downsampling
    x = jax.ShapeDtypeStruct((1, f, f, config.in_channels), jnp.float32)
    z = jax.ShapeDtypeStruct((1, 1, 1, config.latent_channels), jnp.float32)
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    for net, arg in ((encoder_network(config), x), (decoder_network(config), z)):
        tree = jax.eval_shape(net.init, jax.random.PRNGKey(0), arg)
        for module, leaves in tree.items():
            shapes[module] = {k: tuple(v.shape) for k, v in leaves.items()}
    return shapes


# diffusers renamed the mid-block attention's arrays (``_convert_deprecated_attention_blocks``);
# files written before the rename carry the old names, which map onto the new ones.
_DEPRECATED_ATTENTION = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def _modern_name(name: str) -> str:
    parts = name.split(".")
    if "attentions" in parts and len(parts) >= 2 and parts[-2] in _DEPRECATED_ATTENTION:
        return ".".join([*parts[:-2], _DEPRECATED_ATTENTION[parts[-2]], parts[-1]])
    return name


def params_from_torch_names(arrays: Mapping[str, np.ndarray], config: VAEConfig = SD_VAE) -> hk.Params:
    """Haiku params of both halves from an ``AutoencoderKL`` state_dict (diffusers names, old
    attention names accepted; OIHW kernels → HWIO, Linear [out, in] → [in, out], 1×1-conv attention
    weights squeezed). Raises naming the first missing, extra or mis-shaped array."""
    by_module: dict[str, dict[str, np.ndarray]] = {}
    for name, value in arrays.items():
        module, leaf = _modern_name(name).rsplit(".", 1)
        by_module.setdefault(haiku_name(module), {})[leaf] = np.asarray(value, np.float32)
    params: dict[str, dict[str, jax.Array]] = {}
    for module, leaves in expected_shapes(config).items():
        if module not in by_module:
            raise KeyError(f"VAE weights lack the module {module!r} (diffusers name: weight/bias of it)")
        got = by_module.pop(module)
        out = {}
        for leaf, shape in leaves.items():
            torch_leaf = {"w": "weight", "b": "bias", "scale": "weight", "offset": "bias"}[leaf]
            if torch_leaf not in got:
                raise KeyError(f"VAE weights lack {module}.{torch_leaf}")
            a = got[torch_leaf]
            if leaf == "w" and len(shape) == 4:
                a = a.transpose(2, 3, 1, 0)  # OIHW -> HWIO
            elif leaf == "w":
                a = a.reshape(a.shape[:2]).T  # Linear [out, in] (or a [out, in, 1, 1] conv) -> [in, out]
            if a.shape != shape:
                raise ValueError(
                    f"VAE weight {module}.{torch_leaf} has shape {a.shape} here, expected {shape}"
                )
            out[leaf] = jnp.asarray(a)
        params[module] = out
    if by_module:
        raise ValueError(
            f"VAE weights hold modules this config ({config}) does not use, e.g. {sorted(by_module)[:3]}"
        )
    return params


__all__ = [
    "SD_VAE",
    "VAEConfig",
    "decode",
    "decoder_network",
    "encode_moments",
    "encoder_network",
    "expected_shapes",
    "haiku_name",
    "mean_and_std",
    "params_from_torch_names",
    "torch_name",
]
