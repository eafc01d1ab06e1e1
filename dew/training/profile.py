"""``ProfileWindow``: one profiler capture per ``fit``, placed after warm-up so it holds the
loop's steady state and not the compile. ``profile`` (``dew.telemetry.profile``) is the
underlying capture."""

from __future__ import annotations

import dataclasses

from dew.schema import Key, Section, at_least
from dew.telemetry.profile import profile
from dew.training import typed_jax
from dew.training.stage import Stage, StepContext


@dataclasses.dataclass
class ProfileWindow(Stage):
    """Asks for one profiler window per fit: ``steps`` steps traced into ``directory`` after
    ``warmup`` steps have run, so the trace holds the loop and not the compile.

    Counted from the first step of each fit (a resumed run warms up again: it compiles again).
    The capture starts after step ``warmup`` returns and stops after ``warmup + steps``, once the
    state of that step is ready, so the window holds exactly those steps' annotated device work
    (``fit`` wraps each step in ``StepTraceAnnotation("train", step_num=...)``). A fit shorter
    than the window stops the capture at its end.
    """

    steps: int
    directory: str
    warmup: int = 1

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"ProfileWindow.steps must be >= 1, got {self.steps}")
        if self.warmup < 1:
            raise ValueError(
                f"ProfileWindow.warmup must be >= 1, got {self.warmup}: the first step compiles, "
                "and the window is there to show the loop"
            )
        self._capture = profile(self.directory)
        self._seen = 0
        self._first: int | None = None  # the step the fit started from
        self._last_state: object = None
        self.captured_steps: list[int] = []

    def observe(self, ctx: StepContext) -> None:
        self._seen += ctx.steps  # a multi-step call counts its steps
        if self._capture.active:
            self.captured_steps.extend(range(ctx.step - ctx.steps + 1, ctx.step + 1))
            self._last_state = ctx.state
            if self._seen >= self.warmup + self.steps:
                self._capture.stop(block_on=ctx.state)
        elif self._seen >= self.warmup and not self.captured_steps:
            typed_jax.block_until_ready(ctx.state)  # the warm-up's work stays out of the window
            self._capture.start()

    def next_due(self, step: int) -> int | None:
        """The window's edges (``fit``'s multi-step calls end on them, so it holds whole steps)."""
        if self._first is None:
            self._first = step
        edges = (self._first + self.warmup, self._first + self.warmup + self.steps)
        return next((edge for edge in edges if edge > step), None)

    def close(self) -> None:
        if self._capture.active:
            self._capture.stop(block_on=self._last_state)

    def traces(self) -> list[str]:
        return self._capture.traces()


CONFIG = Section(
    "one profiler window per run, placed after the compile",
    {
        "steps": Key(0, "steps to trace (0: no profiling)", **at_least(0, "an int >= 0")),
        "warmup": Key(
            5,
            "steps run before the window opens (the first compiles)",
            **at_least(1, "an int >= 1"),
        ),
        "directory": Key("", "where the trace goes ('': <workdir>/profile)"),
    },
)

__all__ = ["ProfileWindow", "profile"]
