"""Rematerialisation policies: which of a block's activations the backward pass keeps.

A network built with ``remat=<name>`` runs each block under ``jax.checkpoint`` (``hk.remat``) with
``REMAT_POLICIES[name]``; the function and its gradients are unchanged, only what is stored
between the forward and the backward pass (memory) and what is computed again (time).
"""

from __future__ import annotations

import jax

REMAT_POLICIES = {
    "none": None,
    "blocks": jax.checkpoint_policies.nothing_saveable,
    "blocks_save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
"""``remat``: per-block rematerialisation.

* ``none``: every activation is kept (no ``jax.checkpoint``).
* ``blocks`` keeps only each block's inputs (``nothing_saveable``): least memory, the block's
  whole forward computed once more in the backward pass.
* ``blocks_save_dots`` also keeps the outputs of matmuls without batch dimensions
  (``dots_with_no_batch_dims_saveable``: the 1×1 convolutions and linear layers; on XLA a k×k
  convolution is not a dot and is recomputed).
"""


__all__ = ["REMAT_POLICIES"]
