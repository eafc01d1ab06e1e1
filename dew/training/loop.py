"""``fit``: thread a TrainState through a jitted step and call side-effect stages at cadences.

The loop is deliberately short. Everything with a side effect (metrics, evaluation, previews,
checkpoints, progress, profiling) is a ``Stage``; copy this loop and change it freely, the stages
and the pure step work the same in your own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from dew.training.metrics import DeviceSums
from dew.training.state import TrainState

Batch = Mapping[str, Any]
StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]
MultiStepFn = Callable[[TrainState, tuple[Batch, ...]], tuple[TrainState, dict[str, jax.Array]]]

#: Steps whose statistics ``fit`` holds before it checks them for a non-finite flag even when no
#: stage is due (one scalar transfer, and a bound on the device buffers kept alive).
MAX_UNCHECKED = 1024

#: Whether a profiler trace is being recorded (``TraceMe.is_enabled``: 0.1 µs, against ~2 µs
#: for entering and leaving a step annotation that nothing records).
_tracing = jax.profiler.TraceAnnotation.is_enabled

#: The step statistic that flags a non-finite loss or gradient (see ``steps.make_step``).
NONFINITE_FLAG = "skipped_updates"


@dataclasses.dataclass
class StepContext:
    """What the stages see after each step. ``reports`` carries values from earlier stages to
    later ones in the same step (evaluation's loss ranks the checkpoint saved after it).
    ``fit`` updates one context in place every step: a stage that keeps something copies it.

    ``steps`` is how many steps the last call ran: 1, or ``fit``'s ``steps_per_call`` for a
    multi-step call, whose ``stats`` are stacked along a leading axis of that length (row i is
    step ``step - steps + 1 + i``)."""

    step: int
    state: TrainState
    stats: dict[str, jax.Array]
    final: bool
    reports: dict[str, float] = dataclasses.field(default_factory=dict)
    steps: int = 1


def next_multiple(step: int, every: int) -> int | None:
    """The first multiple of ``every`` after ``step`` (None when ``every`` is 0: no cadence)."""
    return (step // every + 1) * every if every > 0 else None


class Stage:
    """A side effect at a cadence: ``observe`` after every call of the step (keep it cheap: no
    host transfer), ``run`` when due (every ``every`` steps and at the final step), ``close``
    once at the end. A stage whose cadence is not ``every`` says where it is due next in
    ``next_due``, so that ``fit``'s multi-step calls end on it."""

    every: int = 0

    def due(self, ctx: StepContext) -> bool:
        return self.every > 0 and (ctx.final or ctx.step % self.every == 0)

    def next_due(self, step: int) -> int | None:
        """The first step after ``step`` at which this stage's cadence makes it due (None: it
        has no cadence; it runs at whichever call boundary ``due`` says)."""
        return next_multiple(step, self.every)

    def observe(self, ctx: StepContext) -> None:
        """Called after every call of the step (``ctx.steps`` steps: 1 unless fit runs several
        per call)."""

    def run(self, ctx: StepContext) -> None:
        """Called when due."""

    def close(self) -> None:
        """Called once when the loop ends, also when it ends with an error."""

    def stop_early(self, ctx: StepContext) -> None:
        """Called when the loop stops early with a state that is still good (the skip policy's
        brake, see ``fit``), before ``close``: a checkpoint stage saves it."""


class NonFiniteError(FloatingPointError):
    """A step produced a non-finite loss or gradient and the policy is to stop; or, with the
    skip policy, too many of a window's updates were skipped (``skipped`` says how many)."""

    def __init__(
        self,
        step: int,
        statistic: str,
        value: float,
        last_good: str | None,
        skipped: tuple[int, int, float] | None = None,
    ):
        self.step, self.statistic, self.value, self.last_good = step, statistic, value, last_good
        self.skipped = skipped
        where = last_good if last_good else "none saved yet"
        saved = "and nothing was saved after it" if skipped is None else "(nor any other skipped one)"
        if skipped is None:
            tail = "(Set the non-finite policy to 'skip' to drop such updates and count them instead.)"
        else:
            count, window, limit = skipped
            tail = (
                f"(The skip policy dropped {count} of the last {window} updates, more than the "
                f"allowed fraction {limit}; the state as of step {step} was saved before stopping.)"
            )
        super().__init__(
            f"non-finite {statistic} ({value}) at step {step}; the update was not applied {saved}. "
            f"Last good checkpoint: {where}. {tail}"
        )


def fit(
    state: TrainState,
    step_fn: StepFn,
    batches: Iterator[Batch],
    num_steps: int,
    stages: Sequence[Stage] = (),
    *,
    nonfinite: str = "stop",
    last_good: Callable[[], str | None] | None = None,
    max_skipped: float = 1.0,
    skip_window: int = 0,
    steps_per_call: int = 1,
    multi_step_fn: MultiStepFn | None = None,
) -> TrainState:
    """Run ``step_fn`` until ``state.step == num_steps``; return the final state.

    Non-finite steps (``stats["skipped_updates"]``, set by ``make_step``, which never applies
    such an update) are summed on the device and checked whenever a stage is about to run and
    at the end, one scalar transfer per check: with ``nonfinite="stop"`` the run raises ``NonFiniteError``
    naming the first bad step, the statistic, and ``last_good()`` (the last checkpoint), before
    any stage could save or report state from after it; with ``"skip"`` it carries on and the
    metrics count the skips. The skip policy has a brake: with ``skip_window`` > 0, after each
    ``skip_window`` steps (and at the end) the skips of that window are counted, and more than
    ``max_skipped`` (a fraction) of them stop the run: every stage's ``stop_early`` is called
    with the current state (skipped updates were never applied, so it is good; a checkpoint
    stage saves it), then ``NonFiniteError`` is raised naming the window's last bad step and
    that checkpoint. While a profiler trace is recording (a ``ProfileWindow`` stage, or
    ``jax.profiler.trace`` around the call), each step runs inside a step annotation, so the
    trace shows the steps by number.

    With ``steps_per_call`` > 1, ``fit`` runs that many steps per call in one program wherever
    no stage's cadence (``Stage.next_due``), brake window or the end falls inside the call, and
    single steps up to such a point; stages see the context after each call
    (``StepContext.steps``). The states are those of single steps, bit for bit on the same
    program. ``multi_step_fn`` is that program (``steps.make_multi_step``); the default,
    ``jax.jit(make_multi_step(step_fn, steps_per_call))``, donates nothing: pass one jitted with
    donation and shardings (``Layout.jit_multi_step``) to update the state in place.
    """
    if nonfinite not in ("stop", "skip"):
        raise ValueError(f"fit: nonfinite must be 'stop' or 'skip', got {nonfinite!r}")
    if not 0.0 <= max_skipped <= 1.0:
        raise ValueError(f"fit: max_skipped must be a fraction in [0, 1], got {max_skipped!r}")
    brake = nonfinite == "skip" and skip_window > 0 and max_skipped < 1.0
    if not isinstance(steps_per_call, int) or steps_per_call < 1:
        raise ValueError(f"fit: steps_per_call must be an int >= 1, got {steps_per_call!r}")
    multi = None
    if steps_per_call > 1:
        multi = multi_step_fn
        if multi is None:
            from dew.training.steps import make_multi_step  # steps imports stages that import this module

            multi = jax.jit(make_multi_step(step_fn, steps_per_call))
    state.check()  # shapes and dtypes at the boundary, before anything is compiled or run
    step = int(jax.device_get(state.step))
    # Per step: the step, a slot write for the flag, each stage's observe/due; no transfer, no
    # allocation that grows with anything but the steps since the last check.
    flags = DeviceSums()  # non-finite flags summed on the device since the last check
    unchecked: list[tuple[dict[str, jax.Array], int]] = []  # those calls' stats and steps
    watch = nonfinite == "stop"
    ctx = StepContext(step=step, state=state, stats={}, final=False)
    boundary = step  # the next step a multi-step call must not run past
    try:
        while step < num_steps:
            n = 1
            if multi is not None:
                if step >= boundary:
                    boundary = _next_boundary(stages, step, num_steps, skip_window if brake else 0)
                if step + steps_per_call <= boundary:
                    n = steps_per_call
            if n > 1:
                call, batch = multi, tuple(next(batches) for _ in range(n))
            else:
                call, batch = step_fn, next(batches)
            if _tracing():  # a profiler is recording: its trace names each call by its first step
                with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
                    state, stats = call(state, batch)
            else:
                state, stats = call(state, batch)
            step += n
            ctx.step, ctx.state, ctx.stats, ctx.final, ctx.steps = step, state, stats, step == num_steps, n
            if ctx.reports:
                ctx.reports = {}
            check = False
            if (watch or brake) and NONFINITE_FLAG in stats:
                flags.add(stats[NONFINITE_FLAG], stacked=n > 1)
                unchecked.append((stats, n))
                if watch:
                    check = True
                    if ctx.final or len(unchecked) >= MAX_UNCHECKED:
                        check = _check(flags, unchecked, step, last_good)
                elif ctx.final or step % skip_window == 0:
                    _brake_if_skipping(flags, unchecked, max_skipped, ctx, stages, last_good)
                    unchecked.clear()
            for stage in stages:
                stage.observe(ctx)
                if stage.due(ctx):
                    if check:  # before the first stage that could save or report this state
                        check = _check(flags, unchecked, step, last_good)
                    stage.run(ctx)
    finally:
        for stage in stages:
            stage.close()
    return state


def _next_boundary(stages: Sequence[Stage], step: int, num_steps: int, skip_window: int) -> int:
    """The first step after ``step`` where a stage is due by its cadence, a brake window ends,
    or the run ends: no multi-step call runs past it."""
    # A stage written without dew's base class (only every/due/observe/run/close) is due by
    # its ``every`` alone.
    dues = [
        stage.next_due(step) if isinstance(stage, Stage) else next_multiple(step, stage.every)
        for stage in stages
    ]
    points = [num_steps, next_multiple(step, skip_window), *dues]
    return min(p for p in points if p is not None)


def _per_step_flags(calls: list[tuple[dict[str, jax.Array], int]]) -> np.ndarray:
    """The non-finite flag of every step of ``calls``, in order (one transfer; failure path)."""
    values = jax.device_get([stats[NONFINITE_FLAG] for stats, _ in calls])
    return np.concatenate([np.reshape(v, (-1,)) for v in values])


def _step_stats(calls: list[tuple[dict[str, jax.Array], int]], index: int) -> dict[str, jax.Array]:
    """The statistics of the ``index``-th step of ``calls`` (a row of a multi-step call's)."""
    for stats, n in calls:
        if index < n:
            return stats if n == 1 else {k: v[index] for k, v in stats.items()}
        index -= n
    raise IndexError(index)


def _brake_if_skipping(
    flags: DeviceSums,
    window: list[tuple[dict[str, jax.Array], int]],
    max_skipped: float,
    ctx: StepContext,
    stages: Sequence[Stage],
    last_good: Callable[[], str | None] | None,
) -> None:
    """Stop (see ``fit``) when more than ``max_skipped`` of the window's updates were skipped."""
    skipped, steps = flags.read()  # one transfer per window
    if not (skipped and skipped > max_skipped * steps):
        return
    values = _per_step_flags(window)
    count = int(np.sum(values > 0))
    last = int(np.flatnonzero(values > 0)[-1])
    bad_step = ctx.step - steps + 1 + last
    statistic, value = _nonfinite_statistic(_step_stats(window, last))
    for stage in stages:
        stage.stop_early(ctx)
    raise NonFiniteError(
        bad_step,
        statistic,
        value,
        last_good() if last_good else None,
        skipped=(count, steps, max_skipped),
    )


def _nonfinite_statistic(stats: dict[str, jax.Array]) -> tuple[str, float]:
    names = [k for k in ("loss", "grad_norm") if k in stats]  # the loss first: it is the cause
    values = jax.device_get([stats[k] for k in names])
    return next(
        ((k, float(v)) for k, v in zip(names, values, strict=True) if not np.isfinite(v)),
        ("gradient", float("nan")),
    )


def _check(
    flags: DeviceSums,
    unchecked: list[tuple[dict[str, jax.Array], int]],
    step: int,
    last_good: Callable[[], str | None] | None,
) -> bool:
    """Raise if one of the unchecked steps was flagged; otherwise start a new window. Returns
    False: nothing is left to check this step."""
    _raise_if_nonfinite(flags, unchecked, step, last_good)
    unchecked.clear()
    return False


def _raise_if_nonfinite(
    flags: DeviceSums,
    unchecked: list[tuple[dict[str, jax.Array], int]],
    step: int,
    last_good: Callable[[], str | None] | None,
) -> None:
    bad, steps = flags.read()  # one transfer: how many of the unchecked steps were flagged
    if not bad:
        return
    first = int(np.flatnonzero(_per_step_flags(unchecked))[0])  # only on failure
    statistic, value = _nonfinite_statistic(_step_stats(unchecked, first))
    raise NonFiniteError(step - steps + 1 + first, statistic, value, last_good() if last_good else None)
