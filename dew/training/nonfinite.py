"""``NonFiniteGuard``: what ``fit`` does about steps whose loss or gradient was not finite.

The pure step never applies such an update; it flags it (``names.NONFINITE_FLAG``, 0 or 1 per
step). The guard sums the flags on the device and reads them, one scalar transfer, only when a
stage is about to run, at the end, and every ``MAX_UNCHECKED`` calls:

* policy ``"stop"``: the first flagged step raises ``NonFiniteError`` naming the step, the
  statistic and the last good checkpoint, before any stage could save or report state from
  after it;
* policy ``"skip"``: the run carries on and the metrics count the skips. With ``window`` > 0
  there is a brake: after every ``window`` steps (and at the end) the window's skips are
  counted, and more than ``max_skipped`` (a fraction) of them stop the run: every stage's
  ``stop_early`` is called with the current state (skipped updates were never applied, so it is
  good; a checkpoint stage saves it), then ``NonFiniteError`` names the window's last bad step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from dew.training.metrics import DeviceSums
from dew.training.names import GRAD_NORM, LOSS, NONFINITE_FLAG
from dew.training.stage import Stage, StepContext

#: Calls whose statistics the guard holds before it reads the flags even when no stage is due
#: (one scalar transfer, and a bound on the device buffers kept alive).
MAX_UNCHECKED = 1024

#: The policies: "stop" ends the run naming the step, "skip" drops the update and counts it.
POLICIES = ("stop", "skip")

Calls = list[tuple[dict[str, jax.Array], int]]  # each call's statistics and its number of steps


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


class NonFiniteGuard:
    """The non-finite policy of one ``fit`` (see the module docstring). ``last_good()`` names
    the newest checkpoint for the error message."""

    def __init__(
        self,
        policy: str = "stop",
        *,
        last_good: Callable[[], str | None] | None = None,
        max_skipped: float = 1.0,
        window: int = 0,
    ):
        if policy not in POLICIES:
            raise ValueError(f"fit: nonfinite must be 'stop' or 'skip', got {policy!r}")
        if not 0.0 <= max_skipped <= 1.0:
            raise ValueError(f"fit: max_skipped must be a fraction in [0, 1], got {max_skipped!r}")
        self.last_good, self.max_skipped = last_good, max_skipped
        self.watch = policy == "stop"
        self.window = window if policy == "skip" and window > 0 and max_skipped < 1.0 else 0
        self._flags = DeviceSums()  # flags summed on the device since the last read
        self._unchecked: Calls = []  # those calls' statistics and step counts
        self._pending = False  # this call's flags are not read yet

    def after_call(self, ctx: StepContext, stages: Sequence[Stage]) -> None:
        """Take the call's flags; read them now at the end, at a brake window's end, or when
        ``MAX_UNCHECKED`` calls wait."""
        self._pending = False
        if not (self.watch or self.window) or NONFINITE_FLAG not in ctx.stats:
            return
        self._flags.add(ctx.stats[NONFINITE_FLAG], stacked=ctx.steps > 1)
        self._unchecked.append((ctx.stats, ctx.steps))
        if self.watch:
            self._pending = True
            if ctx.final or len(self._unchecked) >= MAX_UNCHECKED:
                self._check(ctx.step)
        elif ctx.final or ctx.step % self.window == 0:
            self._brake_if_skipping(ctx, stages)
            self._unchecked.clear()

    def before_stage(self, ctx: StepContext) -> None:
        """Called before a stage runs: a flagged step stops the run here, before any stage could
        save or report its state."""
        if self._pending:
            self._check(ctx.step)

    def _check(self, step: int) -> None:
        bad, steps = self._flags.read()  # one transfer: how many of the unchecked steps were flagged
        if bad:
            first = int(np.flatnonzero(_per_step_flags(self._unchecked))[0])  # only on failure
            statistic, value = _nonfinite_statistic(_step_stats(self._unchecked, first))
            raise NonFiniteError(step - steps + 1 + first, statistic, value, self._last_good())
        self._unchecked.clear()
        self._pending = False

    def _brake_if_skipping(self, ctx: StepContext, stages: Sequence[Stage]) -> None:
        skipped, steps = self._flags.read()  # one transfer per window
        if not (skipped and skipped > self.max_skipped * steps):
            return
        values = _per_step_flags(self._unchecked)
        count = int(np.sum(values > 0))
        last = int(np.flatnonzero(values > 0)[-1])
        statistic, value = _nonfinite_statistic(_step_stats(self._unchecked, last))
        for stage in stages:
            stage.stop_early(ctx)
        raise NonFiniteError(
            ctx.step - steps + 1 + last,
            statistic,
            value,
            self._last_good(),
            skipped=(count, steps, self.max_skipped),
        )

    def _last_good(self) -> str | None:
        return self.last_good() if self.last_good else None


def _per_step_flags(calls: Calls) -> np.ndarray:
    """The non-finite flag of every step of ``calls``, in order (one transfer; failure path)."""
    values = jax.device_get([stats[NONFINITE_FLAG] for stats, _ in calls])
    return np.concatenate([np.reshape(v, (-1,)) for v in values])


def _step_stats(calls: Calls, index: int) -> dict[str, jax.Array]:
    """The statistics of the ``index``-th step of ``calls`` (a row of a multi-step call's)."""
    for stats, n in calls:
        if index < n:
            return stats if n == 1 else {k: v[index] for k, v in stats.items()}
        index -= n
    raise IndexError(index)


def _nonfinite_statistic(stats: dict[str, jax.Array]) -> tuple[str, float]:
    names = [k for k in (LOSS, GRAD_NORM) if k in stats]  # the loss first: it is the cause
    values = jax.device_get([stats[k] for k in names])
    return next(
        ((k, float(v)) for k, v in zip(names, values, strict=True) if not np.isfinite(v)),
        ("gradient", float("nan")),
    )


__all__ = ["MAX_UNCHECKED", "POLICIES", "NonFiniteError", "NonFiniteGuard"]
