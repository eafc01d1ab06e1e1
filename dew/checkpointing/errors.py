"""The ways a checkpoint can fail, shared by every tier and both APIs."""

from __future__ import annotations


class CheckpointRestorationError(ValueError):
    """A restore was asked for and cannot be done as asked: nothing stored, the wrong thing
    stored, a damaged checkpoint, or a template that does not fit. The message names the step."""


class CheckpointDamagedError(CheckpointRestorationError):
    """A stored checkpoint is damaged or incomplete: a file missing, truncated, or changed after
    it was written (its checksum differs), or unreadable. ``step``, ``item`` and ``path`` name
    where; a run resuming from the latest step sets such a step aside and falls back."""

    def __init__(
        self, message: str, *, step: int | None = None, item: str | None = None, path: str | None = None
    ):
        super().__init__(message)
        self.step, self.item, self.path = step, item, path


class CheckpointWriteError(RuntimeError):
    """A checkpoint did not land on disk (raised from ``wait`` or the next save)."""


def first_line(error: BaseException) -> str:
    """An error's first line, bounded: tensorstore errors carry kilobytes of spec."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


class ConfigValidationError(ValueError):
    """A stix checkpointing setting that the IO handler or checkpointer cannot use as combined
    (the configs' own field checks are pydantic's ``ValidationError``); the message names it."""
