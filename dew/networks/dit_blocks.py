"""The DiT family's blocks, built from ``dew.networks.dit_layers``: the adaLN-Zero ``DiTBlock``
(DiT, SiT, REPA, MeanFlow), iMF's ``InContextBlock``, the ``FinalLayer`` and REPA's
``projector``. Parameter names are the references' (``dew.interop.dit_checkpoint``)."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew.networks.dit_feedforward import Mlp, SwiGLU
from dew.networks.dit_layers import (
    Attention,
    Linear,
    RMSNorm,
    layer_norm,
    modulate,
    scaled_normal,
)

# --- blocks --------------------------------------------------------------------------------------


def _normalize(x: jax.Array, norm: str, name: str) -> jax.Array:
    """The block's pre-norm: affine-free LayerNorm (eps 1e-6) or LightningDiT's RMSNorm ``name``."""
    return RMSNorm(name=name)(x) if norm == "rmsnorm" else layer_norm(x)


class DiTBlock(hk.Module):
    """adaLN-Zero block: with (shift, scale, gate) × (msa, mlp) = chunk(Linear(SiLU(c)), 6),
    x += gate_msa · attn(modulate(norm1(x), shift_msa, scale_msa)), then the same for the MLP."""

    def __init__(
        self,
        num_heads: int,
        mlp_ratio: float = 4.0,
        norm: str = "layernorm",
        mlp: str = "gelu_tanh",
        qk_norm: bool = False,
        rotary: tuple[np.ndarray, np.ndarray] | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.num_heads, self.mlp_ratio, self.norm, self.mlp = num_heads, mlp_ratio, norm, mlp
        self.qk_norm, self.rotary = qk_norm, rotary

    def __call__(self, x: jax.Array, c: jax.Array) -> jax.Array:
        d = x.shape[-1]
        mod = Linear(6 * d, w_init=jnp.zeros, name="adaLN_modulation_1")(jax.nn.silu(c))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = jnp.split(mod, 6, axis=-1)
        qk = None if not self.qk_norm else ("rmsnorm" if self.norm == "rmsnorm" else "layernorm")
        attn = Attention(self.num_heads, qk_norm=qk, rotary=self.rotary, name="attn")
        x = x + gate_msa[:, None] * attn(modulate(_normalize(x, self.norm, "norm1"), shift_msa, scale_msa))
        hidden = int(d * self.mlp_ratio)
        ffn = SwiGLU(int(2 / 3 * hidden), name="mlp") if self.mlp == "swiglu" else Mlp(hidden, name="mlp")
        return x + gate_mlp[:, None] * ffn(modulate(_normalize(x, self.norm, "norm2"), shift_mlp, scale_mlp))


class InContextBlock(hk.Module):
    """iMF's ``TransformerBlock``: x += attn(norm1(x)) ⊙ attn_scale, then x += mlp(norm2(x)) ⊙
    mlp_scale, with RMSNorms, ``Attention(fused_qkv=False, bias=False)`` with QK-RMSNorm and 1-D
    rotary positions, ``SwiGLU(fused=False, bias=False)`` of width int(D · mlp_ratio), the gates
    [D] zero-initialised and the linears ``scaled_normal(weight_init_constant)``."""

    def __init__(
        self,
        num_heads: int,
        mlp_ratio: float,
        rotary: tuple[np.ndarray, np.ndarray],
        weight_init_constant: float = 0.32,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.num_heads, self.mlp_ratio, self.rotary = num_heads, mlp_ratio, rotary
        self.weight_init_constant = weight_init_constant

    def __call__(self, x: jax.Array, c: jax.Array | None = None) -> jax.Array:
        del c  # conditioned in context: the conditions are tokens of x
        d = x.shape[-1]
        w_init = scaled_normal(self.weight_init_constant)
        attn_scale = hk.get_parameter("attn_scale", [d], x.dtype, jnp.zeros)
        mlp_scale = hk.get_parameter("mlp_scale", [d], x.dtype, jnp.zeros)
        attn = Attention(
            self.num_heads, "rmsnorm", self.rotary, fused_qkv=False, bias=False, w_init=w_init, name="attn"
        )
        x = x + attn(RMSNorm(name="norm1")(x)) * attn_scale
        ffn = SwiGLU(int(d * self.mlp_ratio), fused=False, bias=False, w_init=w_init, name="mlp")
        return x + ffn(RMSNorm(name="norm2")(x)) * mlp_scale


class FinalLayer(hk.Module):
    """linear(modulate(norm_final(x), shift, scale)), (shift, scale) = chunk(Linear(SiLU(c)), 2);
    every weight zero-initialised. ``modulated=False`` (iMF's): linear(norm(x)), no condition."""

    def __init__(
        self, out_features: int, norm: str = "layernorm", modulated: bool = True, name: str | None = None
    ):
        super().__init__(name=name)
        self.out_features, self.norm, self.modulated = out_features, norm, modulated

    def __call__(self, x: jax.Array, c: jax.Array | None) -> jax.Array:
        if not self.modulated:
            normed = RMSNorm(name="norm")(x) if self.norm == "rmsnorm" else layer_norm(x)
            return Linear(self.out_features, w_init=jnp.zeros, name="linear")(normed)
        assert c is not None, "a modulated final layer needs the conditioning c"
        d = x.shape[-1]
        mod = Linear(2 * d, w_init=jnp.zeros, name="adaLN_modulation_1")(jax.nn.silu(c))
        shift, scale = jnp.split(mod, 2, axis=-1)
        normed = RMSNorm(name="norm_final")(x) if self.norm == "rmsnorm" else layer_norm(x)
        return Linear(self.out_features, w_init=jnp.zeros, name="linear")(modulate(normed, shift, scale))


def projector(x: jax.Array, hidden: int, z_dim: int, index: int) -> jax.Array:
    """REPA's ``build_mlp``: Linear(D, hidden), SiLU, Linear(hidden, hidden), SiLU, Linear(hidden, z)
    (modules ``projectors_<index>_0``, ``_2``, ``_4``)."""
    x = jax.nn.silu(Linear(hidden, name=f"projectors_{index}_0")(x))
    x = jax.nn.silu(Linear(hidden, name=f"projectors_{index}_2")(x))
    return Linear(z_dim, name=f"projectors_{index}_4")(x)
