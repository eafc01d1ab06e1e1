"""The contract between ``fit`` and its side effects: ``StepContext``, what every stage sees
after each call of the step, and ``Stage``, a side effect at a cadence."""

from __future__ import annotations

import dataclasses

import jax

from dew.contracts.state import TrainState


def next_multiple(step: int, every: int) -> int | None:
    """The first multiple of ``every`` after ``step`` (None when ``every`` is 0: no cadence)."""
    return (step // every + 1) * every if every > 0 else None


@dataclasses.dataclass
class StepContext:
    """What the stages see after each step. ``reports`` carries values from earlier stages to
    later ones in the same step (evaluation's loss ranks the checkpoint saved after it).
    ``fit`` updates one context in place every step: a stage that keeps something copies it.

    ``steps`` is how many steps the last call ran: 1, or ``fit``'s ``steps_per_call`` for a
    ``MultiStep`` call, whose ``stats`` are stacked along a leading axis of that length (row i is
    step ``step - steps + 1 + i``)."""

    step: int
    state: TrainState
    stats: dict[str, jax.Array]
    final: bool
    reports: dict[str, float] = dataclasses.field(default_factory=dict[str, float])
    steps: int = 1

    def advance(self, state: TrainState, stats: dict[str, jax.Array], steps: int, num_steps: int) -> None:
        """After a call of ``steps`` steps: the new state and statistics; last step's reports gone."""
        self.step += steps
        self.state, self.stats, self.steps, self.final = state, stats, steps, self.step == num_steps
        if self.reports:
            self.reports = {}


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


__all__ = ["Stage", "StepContext", "next_multiple"]
