"""How ``fit`` calls the step: one step per call, or ``MultiStep``'s several per call.

``fit`` asks ``calls(state, batches, step)`` for the next call's result and how many steps it
ran. ``SingleStep`` runs one; ``MultiStep`` runs ``steps_per_call`` in one compiled program
(``steps.make_multi_step``) wherever no stage's cadence, brake window or the run's end falls
inside the call, and single steps up to such a point, so the stages see the same states as with
single steps (bit for bit on the same program) at every point they are due.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from dew.contracts.state import TrainState
from dew.training import typed_jax
from dew.training.stage import Stage, next_multiple
from dew.training.steps import make_multi_step

Batch = Mapping[str, Any]
Stats = dict[str, jax.Array]
StepFn = Callable[[TrainState, Batch], tuple[TrainState, Stats]]
MultiStepFn = Callable[[TrainState, tuple[Batch, ...]], tuple[TrainState, Stats]]


class SingleStep:
    """One step per call: ``step_fn(state, next(batches))``."""

    def __init__(self, step_fn: StepFn):
        self.step_fn = step_fn

    def plan(self, stages: Sequence[Stage], num_steps: int, window: int) -> None:
        """Told the stages, the last step and the brake window before the loop (unused here)."""

    def __call__(
        self, state: TrainState, batches: Iterator[Batch], step: int
    ) -> tuple[TrainState, Stats, int]:
        state, stats = self.step_fn(state, next(batches))
        return state, stats, 1


class MultiStep(SingleStep):
    """``steps_per_call`` steps per call where no stage is due inside the call (see the module
    docstring). ``multi_fn`` is the program (``make_multi_step(step_fn, steps_per_call)``); the
    default, ``jax.jit`` of it, donates nothing: pass one jitted with donation and shardings
    (``Layout.jit_multi_step``) to update the state in place."""

    def __init__(self, step_fn: StepFn, steps_per_call: int, multi_fn: MultiStepFn | None = None):
        if not isinstance(steps_per_call, int) or steps_per_call < 1:  # pyright: ignore[reportUnnecessaryIsInstance] (any caller)
            raise ValueError(f"fit: steps_per_call must be an int >= 1, got {steps_per_call!r}")
        super().__init__(step_fn)
        self.k = steps_per_call
        self.multi_fn = multi_fn or typed_jax.jit(make_multi_step(step_fn, steps_per_call))
        self._stages: Sequence[Stage] = ()
        self._num_steps = 0
        self._window = 0
        self._boundary = 0  # the next step a call must not run past

    def plan(self, stages: Sequence[Stage], num_steps: int, window: int) -> None:
        self._stages, self._num_steps, self._window, self._boundary = stages, num_steps, window, 0

    def __call__(
        self, state: TrainState, batches: Iterator[Batch], step: int
    ) -> tuple[TrainState, Stats, int]:
        if step >= self._boundary:
            self._boundary = self._next_boundary(step)
        if self.k == 1 or step + self.k > self._boundary:
            return super().__call__(state, batches, step)
        state, stats = self.multi_fn(state, tuple(next(batches) for _ in range(self.k)))
        return state, stats, self.k

    def _next_boundary(self, step: int) -> int:
        """The first step after ``step`` where a stage is due by its cadence, a brake window
        ends, or the run ends."""
        # A stage written without dew's base class (only every/due/observe/run/close) is due by
        # its ``every`` alone.
        dues = [
            stage.next_due(step)
            if isinstance(stage, Stage)  # pyright: ignore[reportUnnecessaryIsInstance] (a duck-typed stage)
            else next_multiple(step, stage.every)
            for stage in self._stages
        ]
        points = [self._num_steps, next_multiple(step, self._window), *dues]
        return min(p for p in points if p is not None)


__all__ = ["MultiStep", "SingleStep"]
