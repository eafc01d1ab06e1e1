"""``TrainState``: the one value threaded through training, and all a resume needs."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp

Params = Any


@chex.dataclass
class TrainState:
    """Hold everything a run must checkpoint to resume where it stopped.

    step:      optimizer updates applied so far (int32 scalar); also the EMA's update count.
    params:    the live parameters.
    opt_state: the optimizer's state (e.g. Adam moments).
    ema:       the raw, zero-initialised EMA of params; read it through ``ema.debias``.
    rng:       the run's one PRNG key (raw uint32[2]), split inside each step, never reseeded.
    pending:   gradient sums of micro-batches not yet applied (``None`` without accumulation).
    """

    step: jax.Array
    params: Params
    opt_state: Any
    ema: Params
    rng: jax.Array
    pending: Params | None = None

    def check(self) -> None:
        """Stage-boundary assertions: cheap, shape/dtype only, safe outside jit."""
        chex.assert_shape(self.step, ())
        chex.assert_type(self.step, jnp.int32)
        chex.assert_shape(self.rng, (2,))
        chex.assert_type(self.rng, jnp.uint32)
        chex.assert_trees_all_equal_shapes_and_dtypes(self.params, self.ema)
