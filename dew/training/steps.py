"""The pure stages: ``init``, ``step`` and ``eval`` built from an Objective and an optimizer.

These functions do no I/O and hold no Python state; jit them (``dew.training.sharding.Layout``
gives the in/out shardings) and thread the ``TrainState`` through any loop.
``dew.training.loop.fit`` is one such loop.

``make_init`` / ``make_step`` / ``make_eval`` take the averages in any form ``as_averages``
accepts; ``init_program`` / ``step_program`` / ``eval_program`` build the same functions from the
run's ``Averages`` as they are (``Programs``, which builds them once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dew.averaging.averager import Averages, as_averages
from dew.averaging.ema import EMASpec
from dew.averaging.power_ema import PowerEMA
from dew.contracts.objective import Objective, Step
from dew.contracts.state import TrainState, num_updates
from dew.training import typed_jax
from dew.training.names import GRAD_NORM, LOSS, LOSS_SCALE, LOSS_SCALE_OVERFLOWS, NONFINITE_FLAG
from dew.training.precision import Precision

Batch = Mapping[str, jax.Array]
Stats = dict[str, jax.Array]


def _check_accumulation(accumulation: int) -> None:
    # A caller outside the checker may pass anything: the check is the refusal it gets.
    if not isinstance(accumulation, int) or accumulation < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"accumulation must be an int >= 1 (micro-batches per update), got {accumulation!r}")


def global_norm(tree: Any, *, laid_end_to_end: bool | None = None) -> jax.Array:
    """sqrt(sum of squares) over every leaf, in float32.

    ``laid_end_to_end`` (default: when traced for the CPU, ``traced_for``): one reduction over
    the leaves concatenated, which XLA:CPU fuses into the reduction's input (one kernel, not one
    per leaf). Elsewhere one sum of squares per leaf, added: on a TPU the concatenation is
    written to memory (SiT-B/2 on a v5e: a 2.9 ms copy of every gradient, per step), while each
    leaf's sum fuses into the kernel that reads it. The two differ only in the order of the
    float32 additions."""
    leaves = [x.astype(jnp.float32) for x in jax.tree.leaves(tree)]
    if laid_end_to_end is None:
        laid_end_to_end = traced_for() == "cpu"
    if laid_end_to_end or len(leaves) == 1:
        flat = [jnp.ravel(x) for x in leaves]
        return jnp.sqrt(jnp.sum(jnp.square(jnp.concatenate(flat) if len(flat) > 1 else flat[0])))
    return jnp.sqrt(sum((jnp.sum(jnp.square(x)) for x in leaves), start=jnp.zeros((), jnp.float32)))


def make_init(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    ema: Averages | EMASpec | None = None,
    *,
    accumulation: int = 1,
    power_ema: PowerEMA | None = None,
    precision: Precision | None = None,
) -> Callable[[jax.Array, Batch], TrainState]:
    """``init(rng, batch) -> TrainState``: fresh params, optimizer state, every average's initial
    tree (``ema``: the run's ``Averages``, or an ``EMASpec`` with ``power_ema`` beside it; the
    classic EMA zero, its law in ``ema_law``, the power-EMA slots zero), (with ``accumulation``
    > 1) zero pending gradient sums and (with a dynamic loss scale) its starting state."""
    return init_program(
        objective, optimizer, as_averages(ema, power_ema), accumulation=accumulation, precision=precision
    )


def init_program(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    averages: Averages,
    *,
    accumulation: int = 1,
    precision: Precision | None = None,
) -> Callable[[jax.Array, Batch], TrainState]:
    """``make_init``'s ``init`` for the run's ``Averages`` as they are (``Programs`` builds them
    once, ``Averages.from_config``)."""
    _check_accumulation(accumulation)

    def init(rng: jax.Array, batch: Batch) -> TrainState:
        rng = jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng
        init_rng, run_rng = jax.random.split(rng)
        params = objective.init(init_rng, batch)
        pending = None if accumulation == 1 else {"grads": jax.tree.map(jnp.zeros_like, params)}
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            rng=run_rng,
            pending=pending,
            **averages.init(params, accumulation),
            loss_scale=None if precision is None else precision.init_state(),
        )

    return init


#: The platform the step is traced for: None is the backend it is traced on
#: (``jax.default_backend()``); a platform's name forces its forms when compiling for another
#: platform's devices (``benchmarks/tpu_memory.py`` compiles for a TPU on the CPU). The forms:
#: a skipped update's per-leaf select (``skip_by_select``) and the gradient norm's per-leaf sums
#: (``global_norm``) everywhere but the CPU.
TRACED_FOR: str | None = None


def traced_for() -> str:
    """The platform ``make_step`` traces for (``TRACED_FOR``, else the default backend)."""
    return TRACED_FOR if TRACED_FOR is not None else jax.default_backend()


def skip_by_select() -> bool:
    """Whether ``make_step``'s skip of a non-finite update is a per-leaf select rather than a
    conditional: on accelerators (``traced_for``), where a conditional made XLA keep a copy of the
    whole state."""
    return traced_for() != "cpu"


def make_step(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    ema: Averages | EMASpec,
    *,
    accumulation: int = 1,
    power_ema: PowerEMA | None = None,
    precision: Precision | None = None,
    skip_nonfinite: bool = True,
) -> Callable[[TrainState, Batch], tuple[TrainState, Stats]]:
    """``step(state, batch) -> (state, stats)``: one batch of gradients, and when it completes
    ``accumulation`` micro-batches, one optimizer update and one EMA update.

    The update applies the mean of the micro-batch gradients, so k micro-batches of size B equal
    one batch of size kB (for a loss that is a mean over examples). A micro-batch whose loss or
    gradient norm is not finite contributes nothing (its update is skipped) and is flagged in
    ``stats["skipped_updates"]`` (0 or 1); ``fit`` decides whether that stops the run. Skipped or
    not, the step count advances (the batch was consumed) and the EMA takes its update with the
    parameters as they stand, so ``state.step // accumulation`` stays the EMA's update count.
    Every average of ``ema`` (``Averages``; or an ``EMASpec`` with ``power_ema`` beside it)
    updates at once.

    With a loss scale (``precision``, float16) the loss is differentiated times the scale and the
    gradients divided by it, in float32. Under a dynamic scale an update whose loss is finite but
    whose gradients overflowed is skipped like a non-finite one but flagged in
    ``stats["loss_scale_overflows"]`` instead (the scale backs off; the non-finite policy is not
    asked); ``stats["loss_scale"]`` is the scale the step used.

    ``skip_nonfinite=False`` (the "stop" policy's step: the run ends at the first flagged step and
    nothing from after it is saved): with one micro-batch per update and no loss scale, the
    update is applied whatever the flag says, and only flagged. Nothing in the update then waits
    for the norm of every gradient, so XLA can fuse each leaf's optimizer and EMA update into the
    product that computes its gradient (SiT-B/2 on a TPU v5e: the update's 6.6 ms of separate
    passes over the state, per step, hide under the products).
    """
    return step_program(
        objective,
        optimizer,
        as_averages(ema, power_ema),
        accumulation=accumulation,
        precision=precision,
        skip_nonfinite=skip_nonfinite,
    )


def step_program(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    averages: Averages,
    *,
    accumulation: int = 1,
    precision: Precision | None = None,
    skip_nonfinite: bool = True,
) -> Callable[[TrainState, Batch], tuple[TrainState, Stats]]:
    """``make_step``'s ``step`` (its contract there) for the run's ``Averages`` as they are."""
    _check_accumulation(accumulation)
    k = accumulation
    # The precision policy when it scales the loss, else None (one name the checker can narrow).
    scaling = precision if precision is not None and precision.loss_scale != "none" else None

    def scaled_gradients(
        scale: jax.Array, params: Any, rng: jax.Array, batch: Batch, index: jax.Array
    ) -> tuple[jax.Array, Stats, Any]:
        """The loss, its statistics and d(loss)/d(params), differentiated as scale × loss (so
        float16 gradients inside the network stay above its subnormals) and divided by the scale
        in float32."""

        def scaled_loss(p: Any) -> tuple[jax.Array, tuple[jax.Array, Stats]]:
            loss, (stats, _aux) = objective.loss(p, rng, batch, Step(index=index))
            return loss * scale, (loss, stats)

        (_, (loss, stats)), grads = typed_jax.value_and_grad(scaled_loss, has_aux=True)(params)

        def unscale(g: jax.Array) -> jax.Array:
            return g / scale

        return loss, stats, jax.tree.map(unscale, grads)

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, Stats]:
        rng, step_rng = jax.random.split(state.rng)
        index = num_updates(state.step, k)
        # The objective's constraint (identity by default): the loss is differentiated at, and
        # the update applied to, the projected parameters (EDM2's forced weight normalisation).
        current = objective.project(state.params)
        scale = None if scaling is None else scaling.current_scale(state.loss_scale)
        if scale is not None:
            loss, stats, grads = scaled_gradients(scale, current, step_rng, batch, index)
        else:
            grad_fn = typed_jax.value_and_grad(objective.loss, has_aux=True)
            (loss, (stats, _aux)), grads = grad_fn(current, step_rng, batch, Step(index=index))
        grad_norm = global_norm(grads)
        # The one check: a NaN or inf anywhere in the gradients makes their norm non-finite.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def apply(grads: Any) -> tuple[Any, Any]:
            updates, opt_state = optimizer.update(grads, state.opt_state, current)
            return optax.apply_updates(current, updates), opt_state

        if k == 1:
            if not skip_nonfinite and scaling is None:
                params, opt_state = apply(grads)
            elif skip_by_select():
                # An accelerator: a per-leaf select fuses into the update, which writes the
                # donated buffers in place; a conditional there makes XLA keep a copy of the whole
                # state (SiT-XL/2 on a TPU v5e: 17.45 GB of temporaries with the conditional,
                # 5.52 GB with the select, at batch 8).
                def keep_finite(new: jax.Array, old: jax.Array) -> jax.Array:
                    return jnp.where(finite, new, old)

                new_params, new_opt_state = apply(grads)
                params = jax.tree.map(keep_finite, new_params, current)
                opt_state = jax.tree.map(keep_finite, new_opt_state, state.opt_state)
            else:
                # The CPU: one branch on the one flag: the common (finite) path updates the donated
                # buffers in place; a per-leaf select of new vs old would read every old buffer
                # twice and make XLA:CPU copy all of them on every step.
                def keep(_grads: Any) -> tuple[Any, Any]:
                    return current, state.opt_state

                params, opt_state = typed_jax.cond(finite, apply, keep, grads)
            averaged = averages.update(state, params, index + 1)
            pending = state.pending
        else:
            assert state.pending is not None, "accumulation > 1 needs TrainState.pending (make_init sets it)"

            def add_finite(sum_: jax.Array, g: jax.Array) -> jax.Array:
                return sum_ + jnp.where(finite, g, jnp.zeros_like(g))

            def mean(g: jax.Array) -> jax.Array:
                return g / k

            total = jax.tree.map(add_finite, state.pending["grads"], grads)

            def update_now() -> tuple[Any, Any, Any, Any]:
                params, opt_state = apply(jax.tree.map(mean, total))
                averaged = averages.update(state, params, index + 1)
                return params, opt_state, averaged, jax.tree.map(jnp.zeros_like, total)

            def accumulate() -> tuple[Any, Any, Any, Any]:
                return state.params, state.opt_state, averages.current(state), total

            params, opt_state, averaged, total = typed_jax.cond(
                (state.step + 1) % k == 0, update_now, accumulate
            )
            pending = {"grads": total}
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            rng=rng,
            pending=pending,
            **averaged,
        )
        skipped = jnp.logical_not(finite).astype(jnp.int32)
        if scaling is None or scale is None:
            return new_state, {**stats, LOSS: loss, GRAD_NORM: grad_norm, NONFINITE_FLAG: skipped}
        stats = {**stats, LOSS: loss, GRAD_NORM: grad_norm, LOSS_SCALE: scale}
        if scaling.dynamic:  # an overflow at a finite loss is the scale's business, not a failure
            overflow = jnp.isfinite(loss) & jnp.logical_not(finite)
            new_state = new_state.replace(loss_scale=scaling.next_state(state.loss_scale, finite))
            stats[LOSS_SCALE_OVERFLOWS] = overflow.astype(jnp.int32)
            skipped = jnp.logical_not(jnp.isfinite(loss)).astype(jnp.int32)
        return new_state, {**stats, NONFINITE_FLAG: skipped}

    return step


def make_multi_step(
    step: Callable[[TrainState, Batch], tuple[TrainState, Stats]], steps: int
) -> Callable[[TrainState, tuple[Batch, ...]], tuple[TrainState, Stats]]:
    """``multi(state, batches) -> (state, stats)``: ``steps`` applications of ``step`` in one
    program (a ``lax.scan`` over the batches, stacked inside it), one per batch of the tuple.

    The state after it is the state after that many calls of ``step``; each statistic comes back
    stacked, ``[steps, ...]``, the i-th row from the i-th batch. Where one call of the step is
    short enough that dispatching it costs the host a noticeable share of it (small networks, or
    a fast accelerator), this pays the dispatch once per ``steps`` (``fit``'s ``steps_per_call``).
    """
    if not isinstance(steps, int) or steps < 1:  # pyright: ignore[reportUnnecessaryIsInstance] (any caller)
        raise ValueError(f"make_multi_step: steps must be an int >= 1 (steps per call), got {steps!r}")

    def multi(state: TrainState, batches: tuple[Batch, ...]) -> tuple[TrainState, Stats]:
        if len(batches) != steps:
            raise ValueError(f"multi-step: expected a tuple of {steps} batches, got {len(batches)}")
        stacked = jax.tree.map(lambda *rows: jnp.stack(rows), *batches)
        return jax.lax.scan(step, state, stacked)

    return multi


def make_eval(
    objective: Objective, ema: Averages | EMASpec, *, accumulation: int = 1
) -> Callable[[TrainState, Batch, jax.Array], Stats]:
    """``eval(state, batch, rng) -> stats`` on the debiased EMA parameters.

    The rng is the caller's (a fixed key gives comparable numbers across evaluations); the
    state's own key is not consumed, so evaluating never changes the training trajectory.
    """
    return eval_program(objective, as_averages(ema), accumulation=accumulation)


def eval_program(
    objective: Objective, averages: Averages, *, accumulation: int = 1
) -> Callable[[TrainState, Batch, jax.Array], Stats]:
    """``make_eval``'s ``eval`` for the run's ``Averages`` as they are."""

    def evaluate(state: TrainState, batch: Batch, rng: jax.Array) -> Stats:
        params = averages.evaluated(state, num_updates(state.step, accumulation))
        return objective.evaluate(params, rng, batch)

    return evaluate


def abstract_state(init: Callable[[jax.Array, Batch], TrainState], batch: Batch) -> Any:
    """The state's shapes and dtypes (and shardings, for a sharded jitted ``init``) without
    computing it: the template a restore needs."""
    return typed_jax.eval_shape(init, jax.random.PRNGKey(0), batch)
