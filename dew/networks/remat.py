"""Rematerialisation policies: which of a block's activations the backward pass keeps.

A network built with ``remat=<name>`` runs each block under ``jax.checkpoint`` (``hk.remat``) with
``REMAT_POLICIES[name]``; the function and its gradients are unchanged, only what is stored
between the forward and the backward pass (memory) and what is computed again (time).
"""

from __future__ import annotations

import jax

MLP_HIDDEN = "mlp_hidden"
"""The name (``jax.ad_checkpoint.checkpoint_name``) a transformer block's feed-forward gives its
hidden pre-activation: fc1's output in ``Mlp``, w12's (or w1's and w3's) in ``SwiGLU``."""

MLP_OUTPUT = "mlp_output"
"""The name a transformer block's feed-forward gives its output (fc2's, w3's or w2's): adaLN-Zero's
gate multiplies it, so the gate's gradient needs it."""

ATTENTION_QKV = "attention_qkv"
"""The name a transformer block's attention gives its q, k and v projections (before QK-norm and
rotary positions)."""

REMAT_POLICIES = {
    "none": None,
    "blocks": jax.checkpoint_policies.nothing_saveable,
    "blocks_save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "blocks_save_mlp": jax.checkpoint_policies.save_only_these_names(MLP_HIDDEN, MLP_OUTPUT),
    "blocks_save_products": jax.checkpoint_policies.save_only_these_names(
        MLP_HIDDEN, MLP_OUTPUT, ATTENTION_QKV
    ),
}
"""``remat``: per-block rematerialisation.

* ``none``: every activation is kept (no ``jax.checkpoint``).
* ``blocks`` keeps only each block's inputs (``nothing_saveable``): least memory, the block's
  whole forward computed once more in the backward pass.
* ``blocks_save_dots`` also keeps the outputs of matmuls without batch dimensions
  (``dots_with_no_batch_dims_saveable``: the 1×1 convolutions and linear layers; on XLA a k×k
  convolution is not a dot and is recomputed).
* ``blocks_save_mlp`` keeps each transformer block's feed-forward hidden pre-activation and output
  (``MLP_HIDDEN``, ``MLP_OUTPUT``: 4·D + D a token) and recomputes the rest: the feed-forward's
  two products (2/3 of a DiT block's FLOPs) are not computed again, the attention branch is.
  Where a network names nothing, it is ``blocks``.
* ``blocks_save_products`` keeps the q, k and v projections too (``ATTENTION_QKV``: 3·D a token
  more): only the attention itself, the output projection and the elementwise work are computed
  again.
"""


__all__ = ["ATTENTION_QKV", "MLP_HIDDEN", "MLP_OUTPUT", "REMAT_POLICIES"]
