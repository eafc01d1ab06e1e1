"""Preemption: on SIGTERM (what cluster schedulers send before they kill) or Ctrl-C, save the
current step, wait for it to land, and stop with ``Preempted``, which says where to resume.

``PreemptionStage`` is a ``fit`` stage: its signal handler only records the signal, and the
stage becomes due after the step that was running when it arrived, so the save sees a
consistent state (and the data position of the batches consumed so far). A restart resumes from
that step bit-identically. A second Ctrl-C while the save is in progress raises ``Interrupted``
(a ``KeyboardInterrupt`` naming the step being saved) at once, abandoning the save; nothing more
is written, and ``landed_steps`` says what a restart resumes from. Without a checkpointer the
run stops without saving and says so.

With several processes the signal may reach only some of them: there JAX's preemption service
(on by default with ``jax.distributed.initialize``) catches SIGTERM itself and
``reached_preemption_sync_point`` makes every process stop at the same step, so no Python handler
is installed; Ctrl-C is then not handled (a ``KeyboardInterrupt``, nothing saved), and with the
service disabled a warning says that preemption is not handled.
"""

from __future__ import annotations

import signal
import threading
import warnings
from typing import Any

import jax

from dew.data.dataset import Dataset
from dew.training.stage import Stage, StepContext

EXIT_CODES: dict[int, int] = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}


class Preempted(Exception):
    """The run stopped on a signal at ``step``; ``path`` is the checkpoint it saved (None when
    checkpointing is off). ``exit_code`` is 128 + the signal number, as a shell reports it."""

    def __init__(self, signum: int, step: int, path: str | None):
        self.signum, self.step, self.path = signum, step, path
        self.exit_code = EXIT_CODES.get(signum, 1)
        name = signal.Signals(signum).name
        if path is None:
            what = "nothing was saved: checkpointing is off (config.checkpoint.every)"
        else:
            what = f"checkpoint of step {step} saved in {path}; run the same command again to resume from it"
        super().__init__(f"preempted by {name} at step {step}: {what}")


class Interrupted(KeyboardInterrupt):
    """A second Ctrl-C arrived while the preemption save of ``step`` was landing: the run stops
    at once, abandoning that save (``Checkpoints.abandon``: nothing on the way out waits for it),
    and writes nothing more. A ``KeyboardInterrupt``, so that whatever catches one
    (``python -m dew.main`` reports what had landed, exit status 130) catches it.

    ``step`` is the preemption save's step; ``steps`` every save that was cut short, oldest
    first: a periodic save still landing when the signal came (the preemption save waits for
    it before it starts) and the preemption save itself."""

    def __init__(self, step: int, steps: tuple[int, ...] | None = None):
        self.step = step
        self.steps = tuple(sorted({*(steps or ()), step}))
        which = " and ".join(str(s) for s in self.steps)
        super().__init__(f"a second Ctrl-C while the checkpoint of step {which} was being saved")


def landed_steps(directory: str) -> list[int]:
    """The steps whose checkpoints have landed in ``directory`` (a path or URI), read as a
    reader would (it touches no file): what a restart can resume from."""
    from dew.checkpointing.checkpoints import Checkpoints

    checkpoints = Checkpoints(directory, read_only=True)
    try:
        return checkpoints.all_steps()
    finally:
        checkpoints.close()


class PreemptionStage(Stage):
    """Saves and stops the run when SIGTERM or SIGINT arrives (see the module docstring).

    Put it last in the stage list, so the step's other stages (its periodic checkpoint, its
    evaluation) have run first. Handlers are installed on construction (main thread only; off
    it the stage does nothing) and the previous ones restored on ``close``.
    """

    def __init__(
        self,
        checkpoints: Any,
        dataset: Dataset | None,
        signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
    ):
        self.checkpoints, self.dataset = checkpoints, dataset
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._sync = jax.process_count() > 1  # JAX's preemption service, not a handler of ours
        if not self._sync and threading.current_thread() is threading.main_thread():
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum
            if signum == signal.SIGINT and signum in self._previous:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts

    def due(self, ctx: StepContext) -> bool:
        if self._sync:
            from jax.experimental import multihost_utils

            try:
                reached = multihost_utils.reached_preemption_sync_point(ctx.step)
            except RuntimeError as e:  # the service is disabled: say so once, then stop asking
                warnings.warn(f"preemption is not handled in this multi-process run: {e}", stacklevel=2)
                self._sync, reached = False, False
            if reached:
                self.received = signal.SIGTERM
            return reached
        return self.received is not None

    def run(self, ctx: StepContext) -> None:
        signum = self.received or signal.SIGTERM
        if self.checkpoints is None:
            raise Preempted(signum, ctx.step, None)
        try:
            if ctx.step not in self.checkpoints.all_steps():  # the periodic save may have just made it
                position = None if self.dataset is None else self.dataset.save_position()
                share = None if self.dataset is None else self.dataset.share
                self.checkpoints.save(ctx.step, ctx.state, position, share=share)
            self.checkpoints.wait()
        except KeyboardInterrupt:  # a second Ctrl-C (the first one's handler is gone): stop now
            saving = tuple(getattr(self.checkpoints, "saving", ()))  # before abandon forgets them
            abandon = getattr(self.checkpoints, "abandon", None)
            if abandon is not None:
                abandon()  # nothing on the way out waits for the save
            raise Interrupted(ctx.step, saving) from None
        raise Preempted(signum, ctx.step, self.checkpoints.path(ctx.step))

    def close(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
