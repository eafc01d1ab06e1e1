"""A small text encoder over raw UTF-8 bytes, trained jointly with the model it conditions.

No tokenizer and no pretrained weights: a prompt is its bytes, shifted by one so that 0 is
padding (``tokenize``). The encoder embeds each byte, adds a learned position embedding, runs a
few pre-norm transformer layers with padding masked out, and mean-pools the non-padding
positions into one vector [B, width] (a bias-free projection of that mean). The empty prompt,
the unconditional datum of classifier-free guidance, is all padding and pools to exactly the
zero vector, as a dropped class label one-hots to zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry

PAD = 0
VOCAB = 257  # 0 = padding, byte b -> b + 1


def tokenize(texts: str | Sequence[str], length: int) -> np.ndarray:
    """UTF-8 bytes + 1, truncated or zero-padded to ``length``: [length] for one text, else [N, length]."""
    single = isinstance(texts, str)
    rows = [texts] if single else list(texts)
    out = np.zeros((len(rows), length), np.int32)
    for i, text in enumerate(rows):
        if not isinstance(text, str):
            raise TypeError(f"tokenize: texts must be str, got {type(text).__name__} ({text!r})")
        raw = np.frombuffer(text.encode("utf-8"), np.uint8)[:length]
        out[i, : len(raw)] = raw.astype(np.int32) + 1
    return out[0] if single else out


def detokenize(tokens: np.ndarray) -> str:
    """The text of one token row (padding dropped)."""
    row = np.asarray(tokens)
    return bytes((row[row != PAD] - 1).astype(np.uint8).tolist()).decode("utf-8", errors="replace")


class ByteText(hk.Module):
    """[B, L] byte tokens -> [B, width] prompt embedding (zeros for an empty prompt)."""

    def __init__(self, width: int = 64, layers: int = 2, heads: int = 4, max_length: int = 64, name=None):
        super().__init__(name=name)
        if width % heads:
            raise ValueError(f"ByteText: width ({width}) must be divisible by heads ({heads})")
        self.width, self.layers, self.heads, self.max_length = width, layers, heads, max_length

    @staticmethod
    def tokens(datum: Any, shape: tuple[int, ...]) -> np.ndarray:
        """The batch-field value of one raw prompt (``None`` or "" is the empty, unconditional one)."""
        if len(shape) != 1:
            raise ValueError(f"ByteText: the text field holds [length] token rows, got a field shape {shape}")
        return tokenize("" if datum is None else datum, shape[0])

    def __call__(self, tokens: jax.Array) -> jax.Array:
        if not jnp.issubdtype(tokens.dtype, jnp.integer) or tokens.ndim != 2:
            raise TypeError(f"ByteText: tokens must be integer [B, L], got {tokens.dtype} {tokens.shape}")
        length = tokens.shape[1]
        if length > self.max_length:
            raise ValueError(f"ByteText: prompts of {length} tokens exceed max_length={self.max_length}")
        mask = tokens != PAD  # [B, L]
        h = hk.Embed(VOCAB, self.width, name="bytes")(tokens)
        h = (
            h
            + hk.get_parameter(
                "position", (self.max_length, self.width), init=hk.initializers.TruncatedNormal(0.02)
            )[:length]
        )
        attend = mask[:, None, None, :]  # keys that are not padding
        for i in range(self.layers):
            a = hk.LayerNorm(-1, True, True, name=f"ln_attn{i}")(h)
            h = h + hk.MultiHeadAttention(
                self.heads,
                self.width // self.heads,
                w_init=hk.initializers.VarianceScaling(1.0),
                name=f"attn{i}",
            )(a, a, a, mask=attend)
            m = hk.LayerNorm(-1, True, True, name=f"ln_mlp{i}")(h)
            m = hk.Linear(self.width, name=f"mlp{i}_out")(
                jax.nn.gelu(hk.Linear(4 * self.width, name=f"mlp{i}_in")(m))
            )
            h = h + m
        h = hk.LayerNorm(-1, True, True, name="ln_out")(h)
        count = jnp.sum(mask, axis=1, keepdims=True)
        pooled = jnp.sum(h * mask[..., None], axis=1) / jnp.maximum(count, 1)
        return hk.Linear(self.width, with_bias=False, name="project")(pooled)


registry.encoders.register("byte_text", ByteText)
