"""jax's calls the trainer makes whose annotations leave a type unknown, typed once.

jax annotates a traced function as a bare ``Callable`` (``jit``, ``value_and_grad``,
``eval_shape``, ``lax.cond``), leaves some arguments unannotated (``device_put``'s tree,
``make_array_from_process_local_data``, ``block_until_ready``) and spells a path's keys as an
unbound type variable (``tree_util.tree_flatten_with_path``), so the strict checker sees each
signature as partly unknown. Here each is taken from jax once, at this boundary (the one
``reportUnknownMemberType`` ignore per function), under the signature the trainer relies on. The
objects are jax's own (``jit is jax.jit``): nothing runs differently.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import jax

if TYPE_CHECKING:
    from jax.sharding import Sharding
    from jax.tree_util import PyTreeDef

T = TypeVar("T")


class _SameTree(Protocol):
    """A call returning a tree of the structure it was given (its leaves placed, or awaited)."""

    def __call__(self, tree: T, /, *args: Any) -> T: ...


#: ``jax.jit(fun, **options)``: the jitted function; the options are jax's own (in and out
#: shardings, donation, static arguments, compiler options).
jit = cast("Callable[..., Callable[..., Any]]", jax.jit)  # pyright: ignore[reportUnknownMemberType]

#: ``jax.value_and_grad(fun, has_aux=...)``: a function returning ``(value, grads)``; with
#: ``has_aux`` the value is ``(loss, aux)``.
value_and_grad = cast(
    "Callable[..., Callable[..., tuple[Any, Any]]]",
    jax.value_and_grad,  # pyright: ignore[reportUnknownMemberType]
)

#: ``jax.eval_shape(fun, *args)``: ``fun``'s outputs as ``jax.ShapeDtypeStruct`` leaves.
eval_shape = cast("Callable[..., Any]", jax.eval_shape)  # pyright: ignore[reportUnknownMemberType]

#: ``jax.device_put(tree, shardings)``: the tree with its leaves on the devices.
device_put = cast(_SameTree, jax.device_put)  # pyright: ignore[reportUnknownMemberType]

#: ``jax.make_array_from_process_local_data(sharding, local_rows)``: one global array from every
#: process's rows.
make_array_from_process_local_data = cast(
    "Callable[[Sharding, Any], jax.Array]",
    jax.make_array_from_process_local_data,  # pyright: ignore[reportUnknownMemberType]
)

#: ``jax.block_until_ready(tree)``: the tree, once every leaf's computation is done.
block_until_ready = cast(_SameTree, jax.block_until_ready)  # pyright: ignore[reportUnknownMemberType]

#: ``jax.tree_util.tree_flatten_with_path(tree)``: ``([(path, leaf), ...], structure)``, a path a
#: tuple of keys (``DictKey``, ``SequenceKey``, ``GetAttrKey``, ``FlattenedIndexKey``).
tree_flatten_with_path = cast(
    "Callable[[Any], tuple[list[tuple[tuple[Hashable, ...], Any]], PyTreeDef]]",
    jax.tree_util.tree_flatten_with_path,  # pyright: ignore[reportUnknownMemberType]
)

#: ``jax.profiler.TraceAnnotation.is_enabled()``: whether a profiler trace is being recorded.
profiler_tracing = cast(
    "Callable[[], bool]",
    jax.profiler.TraceAnnotation.is_enabled,  # pyright: ignore[reportUnknownMemberType]
)

_cond = cast("Callable[..., Any]", jax.lax.cond)  # pyright: ignore[reportUnknownMemberType]


def cond(
    pred: jax.Array | bool, true_fun: Callable[..., T], false_fun: Callable[..., T], *operands: Any
) -> T:
    """``jax.lax.cond(pred, true_fun, false_fun, *operands)``: the chosen branch's result (both
    branches return the same structure, ``T``)."""
    return _cond(pred, true_fun, false_fun, *operands)


__all__ = [
    "block_until_ready",
    "cond",
    "device_put",
    "eval_shape",
    "jit",
    "make_array_from_process_local_data",
    "profiler_tracing",
    "tree_flatten_with_path",
    "value_and_grad",
]
