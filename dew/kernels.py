"""Which implementation traced programs use where several compute the same values: the platform's
choice, made once per process by ``dew.runtime`` and received here by the layers that trace.

A layer never detects the platform itself: it asks ``per_tap_weight_gradient(positions)`` and
gets the answer the runtime set (``dew.runtime.platform``), or the default when nothing was set
(XLA's own kernels everywhere). Choices change speed only, never the values a program computes
to more than floating-point reassociation; each choice is one program, bit-for-bit reproducible.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Iterator

#: A convolution's shape class: (height, width, in channels, out channels, kernel size, padding)
#: of a stride-1 k×k convolution over an NHWC input (the batch is the run's, the same for all).
Convolution = tuple[int, int, int, int, int, int]


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """The platform's kernel choices for this process.

    ``per_tap_weight_gradient_from``: on the CPU backend, convolutions over images of at least
    this many pixels take their weight gradient as a sum over kernel taps
    (``dew.networks.edm_layers``) instead of XLA's; None keeps XLA's everywhere.
    ``per_tap_convolutions``: when not None, it decides instead, shape class by shape class
    (``Convolution``): exactly these take the per-tap gradient (a measured choice,
    ``dew.runtime.kernel_choice``); a shape class not in it keeps XLA's.
    ``reason``: one line saying why, for the run's log.
    """

    per_tap_weight_gradient_from: int | None = None
    reason: str = "XLA's kernels (no platform choice made)"
    per_tap_convolutions: frozenset[Convolution] | None = None


_current = KernelChoice()


def set_choice(choice: KernelChoice) -> None:
    """Set this process's choice (``dew.runtime`` does, before anything is traced)."""
    global _current
    if not isinstance(choice, KernelChoice):
        raise TypeError(f"set_choice takes a KernelChoice, got {type(choice).__name__}")
    _current = choice


def current() -> KernelChoice:
    """This process's choice."""
    return _current


_recording: collections.Counter | None = None


@contextlib.contextmanager
def record_convolutions() -> Iterator[collections.Counter]:
    """Count the shape classes of the convolutions traced inside the block (each call of
    ``per_tap_weight_gradient`` that names its ``convolution``): what the runtime measures."""
    global _recording
    outer, _recording = _recording, collections.Counter()
    try:
        yield _recording
    finally:
        _recording = outer


def per_tap_weight_gradient(positions: int, convolution: Convolution | None = None) -> bool:
    """Whether a convolution over ``positions`` pixels (shape class ``convolution``, when the
    layer names it), traced now, takes the per-tap weight gradient: only on the CPU backend, and
    only where the choice names its shape class, or (no per-class choice) from the size it names."""
    if convolution is not None and _recording is not None:
        _recording[tuple(int(v) for v in convolution)] += 1
    chosen = _current.per_tap_convolutions
    if chosen is not None:
        if convolution is None or tuple(convolution) not in chosen:
            return False
    else:
        threshold = _current.per_tap_weight_gradient_from
        if threshold is None or positions < threshold:
            return False
    import jax

    return jax.default_backend() == "cpu"


__all__ = [
    "Convolution",
    "KernelChoice",
    "current",
    "per_tap_weight_gradient",
    "record_convolutions",
    "set_choice",
]
