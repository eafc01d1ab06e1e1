"""``fit``: thread a TrainState through a jitted step and call side-effect stages at cadences.

The loop is deliberately short. Everything with a side effect (metrics, evaluation, previews,
checkpoints, progress, profiling) is a ``Stage``; copy this loop and change it freely, the stages
and the pure step work the same in your own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import jax

from dew.contracts.state import TrainState
from dew.training import typed_jax
from dew.training.calls import Batch, SingleStep, StepFn
from dew.training.nonfinite import NonFiniteGuard
from dew.training.stage import Stage, StepContext, next_multiple

#: Whether a profiler trace is being recorded (``TraceMe.is_enabled``: 0.1 µs, against ~2 µs
#: for entering and leaving a step annotation that nothing records).
_tracing = typed_jax.profiler_tracing


def fit(
    state: TrainState,
    step: StepFn | SingleStep,
    batches: Iterator[Batch],
    num_steps: int,
    stages: Sequence[Stage] = (),
    *,
    guard: NonFiniteGuard | None = None,
) -> TrainState:
    """Run ``step`` until ``state.step == num_steps``; return the final state.

    ``step`` is the jitted ``step(state, batch) -> (state, stats)``, or a ``MultiStep`` around
    it (several steps per call, ``dew.training.calls``). After each call every stage observes
    the context and, when due, runs; ``guard`` (default: ``NonFiniteGuard("stop")``, see
    ``dew.training.nonfinite``) reads the step's non-finite flags before the first stage that
    runs, so no stage saves or reports a state from after a bad step. While a profiler trace is
    recording, each call runs inside a step annotation, so the trace shows the steps by number.
    """
    calls = step if isinstance(step, SingleStep) else SingleStep(step)
    guard = NonFiniteGuard() if guard is None else guard
    state.check()  # shapes and dtypes at the boundary, before anything is compiled or run
    ctx = StepContext(step=int(jax.device_get(state.step)), state=state, stats={}, final=False)
    calls.plan(stages, num_steps, guard.window)
    try:
        while ctx.step < num_steps:
            if _tracing():  # a profiler is recording: its trace names each call by its first step
                with jax.profiler.StepTraceAnnotation("train", step_num=ctx.step + 1):
                    state, stats, n = calls(state, batches, ctx.step)
            else:
                state, stats, n = calls(state, batches, ctx.step)
            ctx.advance(state, stats, n, num_steps)
            guard.after_call(ctx, stages)
            for stage in stages:
                stage.observe(ctx)
                if stage.due(ctx):
                    guard.before_stage(ctx)
                    stage.run(ctx)
    finally:
        for stage in stages:
            stage.close()
    return state


__all__ = ["Stage", "StepContext", "fit", "next_multiple"]
