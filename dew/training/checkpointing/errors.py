"""The two ways a checkpoint can fail, shared by every tier and both APIs."""

from __future__ import annotations


class CheckpointRestorationError(ValueError):
    """A restore was asked for and cannot be done as asked: nothing stored, the wrong thing
    stored, a damaged checkpoint, or a template that does not fit. The message names the step."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint did not land on disk (raised from ``wait`` or the next save)."""


def first_line(error: BaseException) -> str:
    """An error's first line, bounded: tensorstore errors carry kilobytes of spec."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
