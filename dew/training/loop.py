"""``fit``: thread a TrainState through a jitted step and call side-effect stages at cadences.

The loop is deliberately short. Everything with a side effect (metrics, evaluation, previews,
checkpoints, progress) is a ``Stage``; copy this loop and change it freely, the stages and the
pure step work the same in your own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from dew.training.state import TrainState

Batch = Mapping[str, Any]
StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]


@dataclasses.dataclass
class StepContext:
    """What the stages see after each step. ``reports`` carries values from earlier stages to
    later ones in the same step (evaluation's loss ranks the checkpoint saved after it)."""

    step: int
    state: TrainState
    stats: dict[str, jax.Array]
    final: bool
    reports: dict[str, float] = dataclasses.field(default_factory=dict)


class Stage:
    """A side effect at a cadence: ``observe`` every step (keep it cheap: no host transfer),
    ``run`` when due (every ``every`` steps and at the final step), ``close`` once at the end."""

    every: int = 0

    def due(self, ctx: StepContext) -> bool:
        return self.every > 0 and (ctx.final or ctx.step % self.every == 0)

    def observe(self, ctx: StepContext) -> None:
        """Called after every step."""

    def run(self, ctx: StepContext) -> None:
        """Called when due."""

    def close(self) -> None:
        """Called once when the loop ends, also when it ends with an error."""


def fit(
    state: TrainState,
    step_fn: StepFn,
    batches: Iterator[Batch],
    num_steps: int,
    stages: Sequence[Stage] = (),
) -> TrainState:
    """Run ``step_fn`` until ``state.step == num_steps``; return the final state."""
    step = int(jax.device_get(state.step))
    try:
        while step < num_steps:
            state, stats = step_fn(state, next(batches))
            step += 1
            ctx = StepContext(step=step, state=state, stats=stats, final=step == num_steps)
            for stage in stages:
                stage.observe(ctx)
                if stage.due(ctx):
                    stage.run(ctx)
    finally:
        for stage in stages:
            stage.close()
    return state
