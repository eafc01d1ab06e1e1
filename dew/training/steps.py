"""The pure stages: ``init``, ``step`` and ``eval`` built from an Objective and an optimizer.

These functions do no I/O and hold no Python state; jit them (``jax.jit`` with shardings) and
thread the ``TrainState`` through any loop. ``dew.training.loop.fit`` is one such loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dew.objectives.base import EMASpec, Objective, Step
from dew.training import ema as ema_lib
from dew.training.state import TrainState

Batch = Mapping[str, jax.Array]
Stats = dict[str, jax.Array]


def make_init(
    objective: Objective, optimizer: optax.GradientTransformation
) -> Callable[[jax.Array, Batch], TrainState]:
    """``init(rng, batch) -> TrainState``: fresh params, optimizer state, zero EMA."""

    def init(rng: jax.Array, batch: Batch) -> TrainState:
        rng = jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng
        init_rng, run_rng = jax.random.split(rng)
        params = objective.init(init_rng, batch)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            ema=ema_lib.zeros_like(params),
            rng=run_rng,
        )

    return init


def make_step(
    objective: Objective, optimizer: optax.GradientTransformation, ema: EMASpec
) -> Callable[[TrainState, Batch], tuple[TrainState, Stats]]:
    """``step(state, batch) -> (state, stats)``: one optimizer update and one EMA update."""

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, Stats]:
        rng, step_rng = jax.random.split(state.rng)
        grad_fn = jax.value_and_grad(objective.loss, has_aux=True)
        (loss, (stats, _aux)), grads = grad_fn(state.params, step_rng, batch, Step(index=state.step))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            ema=ema_lib.update(state.ema, params, ema.decay),
            rng=rng,
        )
        return new_state, {**stats, "loss": loss, "grad_norm": optax.tree.norm(grads)}

    return step


def make_eval(objective: Objective, ema: EMASpec) -> Callable[[TrainState, Batch, jax.Array], Stats]:
    """``eval(state, batch, rng) -> stats`` on the debiased EMA parameters.

    The rng is the caller's (a fixed key gives comparable numbers across evaluations); the
    state's own key is not consumed, so evaluating never changes the training trajectory.
    """

    def evaluate(state: TrainState, batch: Batch, rng: jax.Array) -> Stats:
        params = ema_lib.debias(state.ema, ema.decay, state.step)
        return objective.evaluate(params, rng, batch)

    return evaluate


def abstract_state(init: Callable[[jax.Array, Batch], TrainState], batch: Batch) -> Any:
    """The state's shapes and dtypes without computing it: the template a restore needs."""
    return jax.eval_shape(init, jax.random.PRNGKey(0), batch)
