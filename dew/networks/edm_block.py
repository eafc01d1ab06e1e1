"""The reference's unified ``UNetBlock`` (DDPM++, NCSN++ and ADM blocks), NHWC, in haiku."""

from __future__ import annotations

import math
from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from dew.networks.dropout import dropout as apply_dropout
from dew.networks.edm_layers import Conv2d, GroupNorm, Linear


def attention(qkv: jax.Array, num_heads: int) -> jax.Array:
    """Multi-head self-attention over all pixels, [B, H, W, 3C] (q|k|v, head, channel) -> [B, H, W, C].

    The logits and softmax are float32, as the reference's ``AttentionOp``.
    """
    b, h, w, c3 = qkv.shape
    c = c3 // 3
    dh = c // num_heads
    qkv = qkv.reshape(b, h * w, 3, num_heads, dh)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    logits = jnp.einsum("bqhc,bkhc->bhqk", q.astype(jnp.float32), k.astype(jnp.float32) / math.sqrt(dh))
    weights = jax.nn.softmax(logits, axis=-1).astype(qkv.dtype)
    out = jnp.einsum("bhqk,bkhc->bqhc", weights, v)
    return out.reshape(b, h, w, c)


class UNetBlock(hk.Module):
    """GN-SiLU-conv0 (with optional up/down), the embedding, GN-SiLU-dropout-conv1, skip, attention.

    The embedding enters as the reference's ``affine``: added before ``norm1`` (width C,
    ``adaptive_scale=False``, DDPM++/NCSN++) or as a (scale, shift) pair after it (width 2C,
    ``adaptive_scale=True``, ADM). ``num_heads`` follows the reference: 0 without attention, else
    the given count or ``out_channels // channels_per_head`` (which is 0, i.e. no attention, for
    blocks narrower than one head).
    """

    def __init__(
        self,
        out_channels: int,
        *,
        up: bool = False,
        down: bool = False,
        attention: bool = False,
        num_heads: int | None = None,
        channels_per_head: int = 64,
        dropout: float = 0.0,
        skip_scale: float = 1.0,
        eps: float = 1e-5,
        resample_filter: Sequence[float] = (1, 1),
        resample_proj: bool = False,
        adaptive_scale: bool = True,
        init: dict | None = None,
        init_zero: dict | None = None,
        init_attn: dict | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.out_channels, self.up, self.down = out_channels, up, down
        self.num_heads = (
            0 if not attention else num_heads if num_heads is not None else out_channels // channels_per_head
        )
        self.dropout, self.skip_scale, self.eps = dropout, skip_scale, eps
        self.resample_filter, self.resample_proj = tuple(resample_filter), resample_proj
        self.adaptive_scale = adaptive_scale
        self.init = dict(init or {})
        self.init_zero = dict(init_zero if init_zero is not None else {"init_weight": 0})
        self.init_attn = dict(init_attn) if init_attn is not None else self.init

    def __call__(
        self, x: jax.Array, emb: jax.Array, is_training: bool = False, dropout_key: jax.Array | None = None
    ) -> jax.Array:
        """The block's output. ``dropout_key``: the dropout mask's key (in training, with dropout > 0);
        None draws it with ``hk.next_rng_key()`` (a caller that draws the key itself, e.g. outside
        a scan, passes the key ``hk.next_rng_key()`` would have given, and the mask is the same)."""
        cin, cout = x.shape[-1], self.out_channels
        resample = {"up": self.up, "down": self.down, "resample_filter": self.resample_filter}
        orig = x
        x = GroupNorm(self.eps, name="norm0")(x)
        x = Conv2d(cout, 3, **resample, init=self.init, name="conv0")(jax.nn.silu(x))
        params = Linear(cout * (2 if self.adaptive_scale else 1), init=self.init, name="affine")(emb)
        params = params[:, None, None, :].astype(x.dtype)
        if self.adaptive_scale:
            scale, shift = jnp.split(params, 2, axis=-1)
            x = jax.nn.silu(shift + GroupNorm(self.eps, name="norm1")(x) * (scale + 1))
        else:
            x = jax.nn.silu(GroupNorm(self.eps, name="norm1")(x + params))
        if is_training and self.dropout > 0:
            key = hk.next_rng_key() if dropout_key is None else dropout_key
            x = apply_dropout(key, self.dropout, x)
        x = Conv2d(cout, 3, init=self.init_zero, name="conv1")(x)
        if cout != cin or self.up or self.down:
            kernel = 1 if self.resample_proj or cout != cin else 0
            orig = Conv2d(cout, kernel, **resample, init=self.init, name="skip")(orig)
        x = (x + orig) * self.skip_scale
        if self.num_heads:
            qkv = Conv2d(3 * cout, 1, init=self.init_attn, name="qkv")(GroupNorm(self.eps, name="norm2")(x))
            a = attention(qkv, self.num_heads)
            x = (Conv2d(cout, 1, init=self.init_zero, name="proj")(a) + x) * self.skip_scale
        return x
