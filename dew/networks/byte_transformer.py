"""A small decoder-only transformer over bytes (haiku): [B, T] token ids -> [B, T, vocab] logits.

Pre-norm blocks (LayerNorm, causal multi-head self-attention, LayerNorm, GELU MLP of 4x width),
learned token and position embeddings, a final LayerNorm and an untied output projection.
Position t attends to positions <= t only, so logits[:, t] predict token t + 1.

Called on bfloat16 parameters (``config.precision.compute``), it computes in bfloat16 except
its LayerNorms, whose statistics, normalisation and affine are float32 with the result cast
back (as DiT's, ``dew.networks.dit_layers.layer_norm``); haiku's ``MultiHeadAttention`` computes
its logits and softmax in the activations' dtype. On float32 parameters it is float32 throughout.
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.networks.dropout import dropout as apply_dropout


class ByteTransformer(hk.Module):
    """Decoder-only transformer; ``context`` is the longest sequence it accepts."""

    def __init__(
        self,
        vocab: int = 256,
        width: int = 128,
        depth: int = 4,
        heads: int = 4,
        context: int = 128,
        dropout: float = 0.0,
        name: str | None = None,
    ):
        super().__init__(name=name)
        if width % heads:
            raise ValueError(f"ByteTransformer: width ({width}) must be divisible by heads ({heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"ByteTransformer: dropout must be in [0, 1), got {dropout}")
        self.vocab, self.width, self.depth, self.heads = vocab, width, depth, heads
        self.context, self.dropout = context, dropout

    @staticmethod
    def _norm(name: str, h: jax.Array) -> jax.Array:
        """``hk.LayerNorm`` over the last axis computed in float32, returned in ``h``'s dtype."""
        return hk.LayerNorm(-1, True, True, name=name)(h.astype(jnp.float32)).astype(h.dtype)

    def __call__(self, tokens: jax.Array, is_training: bool = False) -> jax.Array:
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise TypeError(
                f"ByteTransformer: tokens must be integer [B, T], got {tokens.dtype} {tokens.shape}"
            )
        length = tokens.shape[1]
        if length > self.context:
            raise ValueError(f"ByteTransformer: {length} tokens exceed context={self.context}")
        init = hk.initializers.TruncatedNormal(0.02)
        h = hk.Embed(self.vocab, self.width, w_init=init, name="embed")(tokens)
        h = h + hk.get_parameter("position", (self.context, self.width), init=init)[:length]
        causal = np.tril(np.ones((length, length), bool))[None, None]
        rate = self.dropout if is_training else 0.0
        out_init = hk.initializers.TruncatedNormal(0.02 / np.sqrt(2 * self.depth))
        for i in range(self.depth):
            a = self._norm(f"ln_attn{i}", h)
            a = hk.MultiHeadAttention(self.heads, self.width // self.heads, w_init=out_init, name=f"attn{i}")(
                a, a, a, mask=causal
            )
            h = h + (apply_dropout(hk.next_rng_key(), rate, a) if rate else a)
            m = self._norm(f"ln_mlp{i}", h)
            m = hk.Linear(4 * self.width, w_init=init, name=f"mlp{i}_in")(m)
            m = hk.Linear(self.width, w_init=out_init, name=f"mlp{i}_out")(jax.nn.gelu(m))
            h = h + (apply_dropout(hk.next_rng_key(), rate, m) if rate else m)
        h = self._norm("ln_out", h)
        return hk.Linear(self.vocab, w_init=init, name="logits")(h)


registry.models.register("byte_transformer", ByteTransformer)
