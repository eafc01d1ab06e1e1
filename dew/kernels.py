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
    (``Convolution``): exactly these take the per-tap gradient (a choice recorded with a run,
    ``dew.runtime.cpu.choice``); a shape class not in it keeps XLA's.
    ``convolution_forms``: when not None, the (input gradient, weight gradient) forms of the
    shape classes it names (``dew.networks.conv_forms``: ``xla``, ``per_tap``, ``im2col``), as
    ``(class, input form, weight form)`` triples; it supersedes the two fields above for those
    classes (a choice recorded with a run).
    ``reason``: one line saying why, for the run's log.
    ``attention``: how ``attention`` computes softmax(q kᵀ/√h) v: ``xla`` (XLA's, the logits
    materialised in the inputs' dtype: float32 in, float32 logits; bfloat16 in, bfloat16 logits
    and probabilities with the softmax's arithmetic in float32, as PyTorch's unfused attention
    under autocast and flax's attention keep them), ``xla_float32_logits``
    (``jax.nn.dot_product_attention``'s XLA path: float32 logits whatever the inputs) or
    ``tpu_flash`` (the TPU's Pallas flash-attention kernel, blockwise, the logits never in
    memory) where the sequence tiles into its 128-token blocks (``config.runtime.attention=
    'flash'``). On a TPU v5e SiT-B/2's bf16 step took 88.7 ms with ``xla``, 109.2 ms with
    ``xla_float32_logits`` (the materialised float32 logits are HBM traffic) and 166 ms with
    the flash kernel at 128-token blocks.
    """

    per_tap_weight_gradient_from: int | None = None
    reason: str = "XLA's kernels (no platform choice made)"
    attention: str = "xla"
    per_tap_convolutions: frozenset[Convolution] | None = None
    convolution_forms: frozenset[tuple[Convolution, str, str]] | None = None

    def forms_of(self, convolution: Convolution) -> tuple[str, str] | None:
        """The (input, weight) gradient forms ``convolution_forms`` names for a class, or None."""
        for named, input_form, weight_form in self.convolution_forms or ():
            if tuple(named) == tuple(convolution):
                return input_form, weight_form
        return None


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
    ``per_tap_weight_gradient`` that names its ``convolution``): the network's convolutions, as
    ``benchmarks/`` counts them."""
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


def convolution_forms(positions: int, convolution: Convolution) -> tuple[str, str]:
    """The (input gradient, weight gradient) forms (``dew.networks.conv_forms``) a convolution of
    shape class ``convolution`` over ``positions`` pixels, traced now, takes: what the choice's
    ``convolution_forms`` names for the class, else XLA's input gradient and the weight gradient
    ``per_tap_weight_gradient`` says; on other backends than the CPU, XLA's for both. Records the
    class where ``record_convolutions`` is active."""
    per_tap = per_tap_weight_gradient(positions, convolution)  # records the class
    named = _current.forms_of(convolution)
    if named is None:
        return "xla", "per_tap" if per_tap else "xla"
    import jax

    return named if jax.default_backend() == "cpu" else ("xla", "xla")


@contextlib.contextmanager
def using(choice: KernelChoice) -> Iterator[KernelChoice]:
    """``with using(choice):`` traces with ``choice`` and restores the previous one after."""
    global _current
    previous = _current
    set_choice(choice)
    try:
        yield choice
    finally:
        _current = previous


#: ``KernelChoice.attention``'s values.
ATTENTIONS = ("xla", "xla_float32_logits", "tpu_flash")
#: The flash kernel's block of tokens: a sequence it cannot tile into whole blocks stays on XLA's.
FLASH_BLOCK = 128


def attention(q, k, v):
    """softmax(q kᵀ / √h) v over [B, T, N, H] queries, keys and values (the result [B, T, N, H]),
    by the platform's choice (``KernelChoice.attention``: its docstring says what each keeps in
    which dtype). The flash kernel's result equals XLA's
    to the compute dtype's roundoff (it sums the softmax blockwise with float32 statistics)."""
    import math

    import jax
    import jax.numpy as jnp

    tokens = q.shape[1]
    if _current.attention == "tpu_flash" and tokens % FLASH_BLOCK == 0 and k.shape[1] % FLASH_BLOCK == 0:
        from jax.experimental.pallas.ops.tpu import flash_attention as flash

        heads_first = [a.transpose(0, 2, 1, 3) for a in (q, k, v)]
        out = flash.flash_attention(*heads_first, sm_scale=1.0 / math.sqrt(q.shape[-1]))
        return out.transpose(0, 2, 1, 3)
    if _current.attention == "xla_float32_logits" or q.dtype == jnp.float32:
        return jax.nn.dot_product_attention(q, k, v)
    # The logits and probabilities in memory in the inputs' dtype, the softmax's arithmetic in
    # float32 (KernelChoice.attention: half the HBM traffic of float32 logits).
    logits = jnp.einsum("btnh,bsnh->bnts", q * (1.0 / math.sqrt(q.shape[-1])), k)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bnts,bsnh->btnh", probs, v)


__all__ = [
    "ATTENTIONS",
    "FLASH_BLOCK",
    "Convolution",
    "KernelChoice",
    "attention",
    "convolution_forms",
    "current",
    "per_tap_weight_gradient",
    "record_convolutions",
    "set_choice",
    "using",
]
