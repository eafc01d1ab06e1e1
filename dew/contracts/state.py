"""``TrainState``: the one value threaded through training, and all a resume needs.

A contract below both the trainer and checkpointing (``dew.training.state`` re-exports it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

import chex
import jax
import jax.numpy as jnp

Params = Any


@chex.dataclass
class TrainState:
    """Hold everything a run must checkpoint to resume where it stopped.

    step:      train steps taken so far (int32 scalar): one per batch the step consumed. Without
               gradient accumulation that is the optimizer updates applied, and the EMA's update
               count; accumulating k micro-batches per update, updates = step // k
               (``num_updates``), and a state with step % k != 0 is mid-accumulation.
    params:    the live parameters.
    opt_state: the optimizer's state (e.g. Adam moments).
    ema:       the raw, zero-initialised EMA of params; read it through ``ema.debias``.
    rng:       the run's one PRNG key (raw uint32[2]), split inside each step, never reseeded.
    pending:   ``None`` without accumulation; with it ``{"grads": tree like params}``: the sum of
               the gradients of the micro-batches since the last update (zeros at a boundary).
               A plain pytree of arrays, so a checkpoint mid-accumulation resumes exactly.
    power_ema: ``None``, or one power-function EMA of params per profile a run tracks for
               post-hoc EMA (``dew.averaging.power_ema.PowerEMA``; no debiasing needed).
    ema_law:   ``None``, or what debiasing ``ema`` needs, as small arrays (``ema.law``: β's law,
               the micro-batches per update, the tracked leaves). ``make_init`` sets it from the
               run's ``EMASpec``; the step passes it through; a checkpoint stores it in its
               ``extra`` item, so ``restore_ema`` debiases from ``ema_params`` + ``extra`` alone.
    loss_scale: ``None``, or under a dynamic loss scale (``dew.training.precision``) its state
               ``{"scale": f32[], "good_steps": i32[]}``, checkpointed in ``extra`` beside the step.
    """

    step: jax.Array
    params: Params
    opt_state: Any
    ema: Params
    rng: jax.Array
    pending: Params | None = None
    power_ema: tuple[Params, ...] | None = None
    ema_law: dict[str, jax.Array] | None = None
    loss_scale: dict[str, jax.Array] | None = None

    if TYPE_CHECKING:
        # chex.dataclass adds ``replace`` at runtime (dataclasses.replace); declared for the checker.
        def replace(self, **changes: Any) -> TrainState: ...

    def check(self) -> None:
        """Stage-boundary assertions: cheap, shape/dtype only, safe outside jit."""
        chex.assert_shape(self.step, ())
        chex.assert_type(self.step, jnp.int32)
        chex.assert_shape(self.rng, (2,))
        chex.assert_type(self.rng, jnp.uint32)
        chex.assert_trees_all_equal_shapes_and_dtypes(self.params, self.ema)
        if self.pending is not None:
            chex.assert_trees_all_equal_shapes_and_dtypes(self.params, self.pending["grads"])
        for slot in self.power_ema or ():
            chex.assert_trees_all_equal_shapes_and_dtypes(self.params, slot)
        if self.ema_law is not None:
            chex.assert_shape([self.ema_law[k] for k in ("decay", "half_life", "ramp_up")], (2,))
            chex.assert_shape(self.ema_law["accumulation"], ())
        if self.loss_scale is not None:
            chex.assert_shape([self.loss_scale["scale"], self.loss_scale["good_steps"]], ())
            chex.assert_type(
                [self.loss_scale["scale"], self.loss_scale["good_steps"]], [jnp.float32, jnp.int32]
            )


@overload
def num_updates(step: jax.Array, accumulation: int = 1) -> jax.Array: ...
@overload
def num_updates(step: int, accumulation: int = 1) -> int: ...
def num_updates(step: jax.Array | int, accumulation: int = 1) -> jax.Array | int:
    """Optimizer (and EMA) updates applied after ``step`` train steps of ``accumulation``
    micro-batches per update."""
    return step // accumulation
