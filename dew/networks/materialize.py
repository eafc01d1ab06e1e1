"""Values that XLA:CPU computes once into their own buffer instead of re-fusing at every use.

XLA duplicates a chain of cheap elementwise operations (a group norm's scale and shift, a SiLU,
a nearest-neighbour upsampling) into every consumer that can fuse it. On XLA:CPU one such
consumer is the layout transpose that feeds a convolution's weight gradient: the whole chain is
recomputed there, in the transposed order, from the tensors it started from. In dew's 16×16
EDM step that transpose took ~30 ms per call where a copy of the same tensor takes ~1 ms, and
the transposes together ~150 ms of thread time per step (``benchmarks/RESULTS.md``).

``jax.lax.optimization_barrier`` would say "compute this once", but XLA:CPU removes barriers
before fusion. A conditional is a fusion boundary it keeps: ``computed_once`` returns its operand
through ``lax.cond`` on a predicate that is always true but that XLA cannot prove, so the
conditional survives simplification and its result is one buffer that every consumer reads.
The never-taken branch negates (an identity branch would let XLA fold the conditional away).

The two marks, ``materialized`` and ``cotangent_materialized``, return their input bit for bit
and differentiate as the identity in forward and reverse mode. The token is any traced scalar
the program computes at run time (a weight's element, say); a constant would let XLA fold the
predicate and drop the conditional (nothing breaks then, the value is simply fused again).
Programs that differentiate nothing (sampling) carry no conditional.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def worth_marking() -> bool:
    """Whether the layers mark their values: on the CPU backend, where XLA's fusion duplicates
    them. Accelerators keep their programs as they were (a conditional there may cost a
    synchronisation with the host; not measured). Read at trace time."""
    return jax.default_backend() == "cpu"


def marked(fn: Callable[[jax.Array], jax.Array], x: jax.Array, token: jax.Array) -> jax.Array:
    """``fn(x)``; where ``worth_marking``, with ``x`` (``materialized``) and the gradient reaching
    ``fn``'s output (``cotangent_materialized``) each computed once. What the layers call."""
    if not worth_marking():
        return fn(x)
    return cotangent_materialized(fn(materialized(x, token)), token)


def computed_once(x: jax.Array, token: jax.Array) -> jax.Array:
    """``x`` itself, from a conditional that XLA keeps: one buffer for all of x's consumers."""
    bits = jax.lax.bitcast_convert_type(token.astype(jnp.float32), jnp.uint32)
    always = (bits | jnp.uint32(1)) != 0  # true for every 32-bit pattern; XLA does not fold it
    return jax.lax.cond(always, lambda v: v, jnp.negative, x)


@jax.custom_jvp
def materialized(x: jax.Array, token: jax.Array) -> jax.Array:
    """``x``; where ``x`` or ``token`` is differentiated, computed once into its own buffer.

    Only a derivative re-reads ``x`` in other layouts (a weight gradient's transposes), so a
    program that differentiates neither (sampling) runs ``x`` as it is, without the conditional's
    copy. Pass the weight that multiplies ``x`` (an element of it) as the token, so that the mark
    also holds when only the weight is differentiated. The derivative is the identity in ``x``
    and zero in ``token``.
    """
    del token
    return x


@materialized.defjvp
def _materialized_jvp(primals, tangents):
    x, token = primals
    x_dot, _ = tangents
    return computed_once(x, token), x_dot


@jax.custom_jvp
def cotangent_materialized(y: jax.Array, token: jax.Array) -> jax.Array:
    """``y`` unchanged; in reverse mode the cotangent that reaches ``y`` is computed once.

    The tangent passes through ``computed_once``, which is linear in it (both branches are), so
    JAX transposes that conditional into the backward pass: the gradient flowing into the
    operation that produced ``y`` is one buffer, not a chain re-fused into each of its uses.
    """
    return y


@cotangent_materialized.defjvp
def _cotangent_materialized_jvp(primals, tangents):
    y, token = primals
    y_dot, _ = tangents
    return y, computed_once(y_dot, token)
