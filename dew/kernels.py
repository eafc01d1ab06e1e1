"""Which implementation traced programs use where several compute the same values: the platform's
choice, made once per process by ``dew.runtime`` and received here by the layers that trace.

A layer never detects the platform itself: it asks ``per_tap_weight_gradient(positions)`` and
gets the answer the runtime set (``dew.runtime.platform``), or the default when nothing was set
(XLA's own kernels everywhere). Choices change speed only, never the values a program computes
to more than floating-point reassociation; each choice is one program, bit-for-bit reproducible.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """The platform's kernel choices for this process.

    ``per_tap_weight_gradient_from``: on the CPU backend, convolutions over images of at least
    this many pixels take their weight gradient as a sum over kernel taps
    (``dew.networks.edm_layers``) instead of XLA's; None keeps XLA's everywhere.
    ``reason``: one line saying why, for the run's log.
    """

    per_tap_weight_gradient_from: int | None = None
    reason: str = "XLA's kernels (no platform choice made)"


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


def per_tap_weight_gradient(positions: int) -> bool:
    """Whether a convolution over ``positions`` pixels, traced now, takes the per-tap weight
    gradient: only on the CPU backend, and only from the size the choice names."""
    threshold = _current.per_tap_weight_gradient_from
    if threshold is None or positions < threshold:
        return False
    import jax

    return jax.default_backend() == "cpu"


__all__ = ["KernelChoice", "current", "per_tap_weight_gradient", "set_choice"]
