"""The layers of DiT (facebookresearch/DiT ``models.py``) and its timm parts, in haiku.

Parameters are named as the reference's ``state_dict`` keys with each ``.N`` index joined to the
module before it (``blocks.3.attn.qkv.weight`` -> module ``<top>/blocks_3/attn/qkv``, parameter
``weight``), linear weights [in, out], the patch convolution HWIO. Initialisation is the
reference's ``initialize_weights``: xavier-uniform linear weights with zero biases, the patch
convolution xavier-uniform over its flattened [out, in·p·p] view, N(0, 0.02²) for the label table
and the timestep MLP, zeros for every ``adaLN_modulation`` and the final linear layer.

The options LightningDiT adds to the same block (hustvl/LightningDiT ``models/lightningdit.py``)
are here too, each off by default: RMSNorm (``models/rmsnorm.py``: x·rsqrt(mean x² + 1e-6)·weight)
in place of the affine-free LayerNorms, QK-norm (a per-head LayerNorm with affine, eps 1e-5, as
timm's ``Attention(qk_norm=True)``; RMSNorm when ``norm="rmsnorm"``), the SwiGLU feed-forward
(``SwiGLUFFN``: w3(silu(x1)·x2) with [x1, x2] = w12(x), hidden width int(2/3 · mlp_ratio · D)),
and 2-D rotary positions on q and k (``VisionRotaryEmbeddingFast``).

improved MeanFlow's in-context block (Lyy-iiis/imeanflow ``models/imfDiT.py``: ``TransformerBlock``,
``RoPEAttention``, ``SwiGLUMlp``, ``FinalLayer``) is built from the same parts with their options:
``Attention(fused_qkv=False, bias=False)`` (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``),
``SwiGLU(fused=False, bias=False)`` (w2(silu(w1 x) · w3 x), hidden int(mlp_ratio · D)), 1-D rotary
positions over the whole sequence (``rotary_1d``), zero-initialised vector gates instead of adaLN
(``InContextBlock``), and ``FinalLayer(modulated=False)``; its scaled-variance initialisation is
``scaled_normal``. The feed-forwards (``Mlp``, ``SwiGLU``) are ``dew.networks.dit_feedforward``;
the blocks built from these layers are ``dew.networks.dit_blocks``.
"""

from __future__ import annotations

import math

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from haiku import experimental as hk_experimental
from jax.ad_checkpoint import checkpoint_name

from dew import kernels
from dew.networks.remat import ATTENTION_QKV

# --- initialisers ---------------------------------------------------------------------------------


def xavier_uniform(fan_in: int, fan_out: int) -> hk.initializers.Initializer:
    """torch.nn.init.xavier_uniform_: U(±√(6 / (fan_in + fan_out)))."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return hk.initializers.RandomUniform(-limit, limit)


def normal(std: float) -> hk.initializers.Initializer:
    return hk.initializers.RandomNormal(stddev=std)


def scaled_normal(constant: float) -> hk.initializers.Initializer:
    """iMF's ``scaled_variance``: N(0, (constant / √fan_in)²) for a [in, out] weight (fan_in = in)."""

    def init(shape, dtype):
        std = constant / math.sqrt(shape[0])
        return jax.random.normal(hk.next_rng_key(), shape, jnp.float32).astype(dtype) * std

    return init


# --- the leaf layers -------------------------------------------------------------------------------


class Linear(hk.Module):
    """x @ weight + bias (torch ``nn.Linear``), weight [in, out]; xavier-uniform unless told."""

    def __init__(
        self,
        out_features: int,
        *,
        bias: bool = True,
        w_init: hk.initializers.Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.out_features, self.use_bias, self.w_init = out_features, bias, w_init

    def __call__(self, x: jax.Array) -> jax.Array:
        fan_in = x.shape[-1]
        init = self.w_init or xavier_uniform(fan_in, self.out_features)
        w = hk.get_parameter("weight", [fan_in, self.out_features], x.dtype, init)
        y = jnp.dot(x, w)
        if self.use_bias:
            y = y + hk.get_parameter("bias", [self.out_features], x.dtype, jnp.zeros)
        return y


def layer_norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``nn.LayerNorm(D, elementwise_affine=False, eps)``: (x - mean) / √(var + eps), biased var."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype)


class AffineLayerNorm(hk.Module):
    """``nn.LayerNorm(D)`` with its ``weight`` (ones) and ``bias`` (zeros); timm's QK-norm."""

    def __init__(self, eps: float = 1e-5, name: str | None = None):
        super().__init__(name=name)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        d = x.shape[-1]
        weight = hk.get_parameter("weight", [d], x.dtype, jnp.ones)
        bias = hk.get_parameter("bias", [d], x.dtype, jnp.zeros)
        return layer_norm(x, self.eps) * weight + bias


class RMSNorm(hk.Module):
    """LightningDiT's ``RMSNorm``: x · rsqrt(mean(x²) + eps) · weight (computed in float32)."""

    def __init__(self, eps: float = 1e-6, name: str | None = None):
        super().__init__(name=name)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        weight = hk.get_parameter("weight", [x.shape[-1]], x.dtype, jnp.ones)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return normed.astype(x.dtype) * weight


def modulate(x: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
    """x · (1 + scale) + shift, the [B, D] modulation broadcast over tokens."""
    return x * (1 + scale[:, None, :]) + shift[:, None, :]


# --- embeddings --------------------------------------------------------------------------------------


def timestep_embedding(t: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
    """GLIDE's sinusoidal embedding: [cos(t·f_i), sin(t·f_i)], f_i = exp(-ln(max_period)·i/half)."""
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t[:, None].astype(jnp.float32) * freqs[None]
    embedding = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
    if dim % 2:
        embedding = jnp.concatenate([embedding, jnp.zeros_like(embedding[:, :1])], axis=-1)
    return embedding


class TimestepEmbedder(hk.Module):
    """t [B] -> [B, D]: ``mlp`` (Linear(256, D), SiLU, Linear(D, D)) on the sinusoidal embedding;
    weights N(0, 0.02²) (DiT), or ``scaled_normal(init_constant)`` when given (iMF)."""

    def __init__(
        self,
        hidden_size: int,
        frequency_embedding_size: int = 256,
        init_constant: float | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.hidden_size, self.frequency_embedding_size = hidden_size, frequency_embedding_size
        self.init_constant = init_constant

    def __call__(self, t: jax.Array, dtype: jnp.dtype) -> jax.Array:
        t_freq = timestep_embedding(t, self.frequency_embedding_size).astype(dtype)
        w_init = normal(0.02) if self.init_constant is None else scaled_normal(self.init_constant)
        h = Linear(self.hidden_size, w_init=w_init, name="mlp_0")(t_freq)
        return Linear(self.hidden_size, w_init=w_init, name="mlp_2")(jax.nn.silu(h))


class LabelEmbedder(hk.Module):
    """Class labels [B] int -> [B, D] from ``embedding_table`` (num_classes + 1 rows when
    ``null_class``, by default when ``dropout_prob`` > 0 as DiT builds it; MeanFlow keeps the row
    with ``dropout_prob`` 0 and drops labels itself: row ``num_classes`` is the null class).

    Labels are replaced by the null class where ``force_drop_ids == 1``, or, when training with
    ``dropout_prob`` > 0 and no ``force_drop_ids``, where U(0, 1) < ``dropout_prob`` (a draw from
    ``hk.next_rng_key()``), as the reference's ``token_drop``.
    """

    def __init__(
        self,
        num_classes: int,
        hidden_size: int,
        dropout_prob: float,
        null_class: bool | None = None,
        init_std: float = 0.02,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.num_classes, self.hidden_size, self.dropout_prob = num_classes, hidden_size, dropout_prob
        self.null_class = dropout_prob > 0 if null_class is None else null_class
        self.init_std = init_std

    def __call__(
        self, labels: jax.Array, train: bool, force_drop_ids: jax.Array | None, dtype: jnp.dtype
    ) -> jax.Array:
        rows = self.num_classes + int(self.null_class)
        with hk_experimental.name_scope("embedding_table"):
            table = hk.get_parameter("weight", [rows, self.hidden_size], dtype, normal(self.init_std))
        if force_drop_ids is not None:
            labels = jnp.where(force_drop_ids == 1, self.num_classes, labels)
        elif train and self.dropout_prob > 0:
            drop = jax.random.uniform(hk.next_rng_key(), labels.shape) < self.dropout_prob
            labels = jnp.where(drop, self.num_classes, labels)
        return jnp.take(table, labels, axis=0)


class PatchEmbed(hk.Module):
    """timm ``PatchEmbed``: a p×p convolution with stride p ([B, H, W, C] -> [B, HW/p², D]),
    tokens row-major over the (H/p, W/p) grid."""

    def __init__(self, patch_size: int, hidden_size: int, name: str | None = None):
        super().__init__(name=name)
        self.patch_size, self.hidden_size = patch_size, hidden_size

    def __call__(self, x: jax.Array) -> jax.Array:
        p, c = self.patch_size, x.shape[-1]
        with hk_experimental.name_scope("proj"):
            w = hk.get_parameter(
                "weight", [p, p, c, self.hidden_size], x.dtype, xavier_uniform(c * p * p, self.hidden_size)
            )
            b = hk.get_parameter("bias", [self.hidden_size], x.dtype, jnp.zeros)
        y = jax.lax.conv_general_dilated(x, w, (p, p), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y + b).reshape(x.shape[0], -1, self.hidden_size)


def get_2d_sincos_pos_embed(embed_dim: int, grid_size: int) -> np.ndarray:
    """MAE's fixed 2-D sin-cos position embedding [grid², D] (float64, as the reference computes it):
    token m = row·grid + column; the first D/2 channels encode the column, the last D/2 the row
    (``meshgrid(grid_w, grid_h)`` puts the column index first), each as [sin(pos·ω), cos(pos·ω)]
    with ω_i = 1 / 10000^(i / (D/4))."""
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, grid_size, grid_size])
    emb_h = _sincos_1d(embed_dim // 2, grid[0])
    emb_w = _sincos_1d(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


def _sincos_1d(embed_dim: int, pos: np.ndarray) -> np.ndarray:
    omega = np.arange(embed_dim // 2, dtype=np.float64)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def rotary_tables(head_dim: int, grid_size: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """LightningDiT's ``VisionRotaryEmbeddingFast(dim=head_dim // 2, pt_seq_len=grid)``: cos and
    sin tables [grid², head_dim]; the first half of each head's channels rotate with the row, the
    second half with the column, each frequency repeated for its interleaved (even, odd) pair."""
    dim = head_dim // 2
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2)[: dim // 2].astype(np.float32) / dim))
    t = np.arange(grid_size, dtype=np.float32) / grid_size * grid_size
    freqs = np.repeat(np.einsum("t,f->tf", t, freqs).astype(np.float32), 2, axis=-1)  # [grid, dim]
    rows = np.broadcast_to(freqs[:, None, :], (grid_size, grid_size, dim))
    cols = np.broadcast_to(freqs[None, :, :], (grid_size, grid_size, dim))
    table = np.concatenate([rows, cols], axis=-1).reshape(-1, 2 * dim)
    return np.cos(table).astype(np.float32), np.sin(table).astype(np.float32)


def rotary_1d(head_dim: int, length: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """iMF's ``precompute_rope_freqs`` over positions 0 … length − 1 of the whole sequence, as cos
    and sin tables [length, head_dim]: channel pair (2i, 2i + 1) rotates by pos · θ^(−2i/head_dim)
    (the reference multiplies each pair, read as a complex number, by e^{i·pos·f_i})."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    angles = np.outer(np.arange(length, dtype=np.float32), freqs).astype(np.float32)
    table = np.repeat(angles, 2, axis=-1)
    return np.cos(table).astype(np.float32), np.sin(table).astype(np.float32)


def apply_rotary(x: jax.Array, cos: np.ndarray, sin: np.ndarray) -> jax.Array:
    """x [B, T, N, H] -> x·cos + rotate_half(x)·sin, rotate_half((a, b) pairs) = (-b, a)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
    cos_, sin_ = (jnp.asarray(a, x.dtype)[None, :, None, :] for a in (cos, sin))
    return x * cos_ + rotated * sin_


# --- attention -----------------------------------------------------------------------------------


class HeadsLinear(hk.Module):
    """``Linear(parts · D)`` (the same ``weight`` [D, parts · D] and ``bias`` [parts · D], the same
    initialisation) whose output is split into ``parts`` tensors of heads [B, T, N, D / N]: each
    part a product with its own slice of the weight, viewed as [D, N, D / N].

    The numbers are ``Linear``'s followed by a reshape and a split, product by product. As one
    [B, T, parts · D] product reshaped and sliced, XLA on a TPU gives the output a layout the
    heads cannot use and copies it twice per block (SiT-B/2 on a v5e: 5.6 ms of a 83.5 ms step),
    and gathers the parts' gradients back into one buffer; a product per part writes the heads'
    layout directly (flax's ``MultiHeadAttention`` projects q, k and v this way)."""

    def __init__(
        self,
        num_heads: int,
        parts: int,
        *,
        bias: bool = True,
        w_init: hk.initializers.Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.num_heads, self.parts, self.use_bias, self.w_init = num_heads, parts, bias, w_init

    def __call__(self, x: jax.Array) -> list[jax.Array]:
        c = x.shape[-1]
        n, h = self.num_heads, c // self.num_heads
        init = self.w_init or xavier_uniform(c, self.parts * c)
        w = hk.get_parameter("weight", [c, self.parts * c], x.dtype, init).reshape(c, self.parts, n, h)
        heads = [jnp.einsum("btc,cnh->btnh", x, w[:, i]) for i in range(self.parts)]
        if self.use_bias:
            b = hk.get_parameter("bias", [self.parts * c], x.dtype, jnp.zeros).reshape(self.parts, n, h)
            heads = [y + b[i] for i, y in enumerate(heads)]
        return heads


class HeadsOutput(hk.Module):
    """``Linear(D)`` (``weight`` [D, D], ``bias`` [D]) applied to heads [B, T, N, D / N] laid end
    to end, as one product over the heads and their width together (no reshape of the heads
    into [B, T, D] first: ``HeadsLinear`` says why)."""

    def __init__(
        self,
        *,
        bias: bool = True,
        w_init: hk.initializers.Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.use_bias, self.w_init = bias, w_init

    def __call__(self, heads: jax.Array) -> jax.Array:
        _, _, n, h = heads.shape
        c = n * h
        init = self.w_init or xavier_uniform(c, c)
        w = hk.get_parameter("weight", [c, c], heads.dtype, init).reshape(n, h, c)
        y = jnp.einsum("btnh,nhc->btc", heads, w)
        if self.use_bias:
            y = y + hk.get_parameter("bias", [c], heads.dtype, jnp.zeros)
        return y


class Attention(hk.Module):
    """timm ``Attention(dim, num_heads, qkv_bias=True)``: softmax(q kᵀ / √h) v per head through
    ``dew.kernels.attention`` (XLA's, or the TPU's flash kernel: the platform's choice), then
    ``proj``. ``qk_norm``: None, "layernorm" or "rmsnorm" on each head's q and k; ``rotary``:
    (cos, sin) tables.
    ``fused_qkv=False``: iMF's ``RoPEAttention`` layout, ``q_proj``/``k_proj``/``v_proj`` then
    ``out_proj``; ``bias``: the projections' biases; ``w_init``: their weights' initialiser.
    The projections are ``HeadsLinear`` and ``HeadsOutput``: ``Linear``'s parameters and numbers
    in the heads' layout."""

    def __init__(
        self,
        num_heads: int,
        qk_norm: str | None = None,
        rotary: tuple[np.ndarray, np.ndarray] | None = None,
        fused_qkv: bool = True,
        bias: bool = True,
        w_init: hk.initializers.Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.num_heads, self.qk_norm, self.rotary = num_heads, qk_norm, rotary
        self.fused_qkv, self.bias, self.w_init = fused_qkv, bias, w_init

    def __call__(self, x: jax.Array) -> jax.Array:
        n = self.num_heads
        if self.fused_qkv:
            q, k, v = HeadsLinear(n, 3, bias=self.bias, w_init=self.w_init, name="qkv")(x)  # [B, T, N, H]
        else:
            q, k, v = (
                HeadsLinear(n, 1, bias=self.bias, w_init=self.w_init, name=f"{p}_proj")(x)[0] for p in "qkv"
            )
        q, k, v = (checkpoint_name(a, ATTENTION_QKV) for a in (q, k, v))
        if self.qk_norm == "layernorm":
            q, k = AffineLayerNorm(name="q_norm")(q), AffineLayerNorm(name="k_norm")(k)
        elif self.qk_norm == "rmsnorm":
            q, k = RMSNorm(name="q_norm")(q), RMSNorm(name="k_norm")(k)
        if self.rotary is not None:
            q, k = apply_rotary(q, *self.rotary), apply_rotary(k, *self.rotary)
        out = kernels.attention(q, k, v)  # [B, T, N, H]: XLA's, or the TPU's flash kernel
        name = "proj" if self.fused_qkv else "out_proj"
        return HeadsOutput(bias=self.bias, w_init=self.w_init, name=name)(out)
