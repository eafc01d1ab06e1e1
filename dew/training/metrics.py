"""Step statistics summed on the device, read once per window in one transfer.

A training loop produces a small tree of device scalars every step (loss, gradient norm, flags).
Fetching each of them costs a device round trip; fetching a window's worth one by one (thousands
of arrays) costs tens of milliseconds. ``DeviceSums`` instead keeps the last few steps' trees by
reference (a slot write per step: no transfer, no dispatch, no allocation) and every ``chunk``
steps folds them into a running sum with one jitted call, so per step the host pays a slot write
plus 1/``chunk`` of a dispatch, and ``read()`` moves one small tree to the host.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.training import typed_jax


def _fold(sums: Any, chunk: list[Any], stacked: bool) -> Any:
    def one(total: jax.Array, *trees: jax.Array) -> jax.Array:
        return total + sum(jnp.sum(_wide(x), axis=0) if stacked else _wide(x) for x in trees)

    return jax.tree.map(one, sums, *chunk)


def _wide(x: jax.Array) -> jax.Array:
    """Sum floats in float32 (a bf16 loss summed over a window would lose its digits) and
    integers and booleans (counts) in int32."""
    return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.int32)


def _zeros(tree: Any, stacked: bool) -> Any:
    """Zero sums for ``tree``'s statistics (one step's shape: a stacked tree's leading axis dropped)."""

    def zero(x: jax.Array) -> jax.Array:
        return jnp.zeros(x.shape[1:] if stacked else x.shape, _wide(x).dtype)

    return jax.tree.map(zero, tree)


def _sharding(x: jax.Array) -> jax.sharding.Sharding:
    return x.sharding


def _zeros_like(tree: Any) -> Any:
    return jax.tree.map(jnp.zeros_like, tree)


def _shapes(tree: Any) -> list[tuple[int, ...]]:
    return [x.shape for x in jax.tree.leaves(tree)]


def _host(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float64 if np.issubdtype(x.dtype, np.floating) else np.int64)


class DeviceSums:
    """Running sums of a stream of same-structured trees of arrays (``{name: scalar}`` stats, or
    a single flag), on the device.

    ``add(tree)`` every step (or ``add(tree, stacked=True)`` once for a multi-step call's
    statistics, stacked along a leading step axis); ``read()`` returns ``(sums, count)`` on the
    host (float64 for floating statistics, int64 for counts; ``count`` in steps) in one
    transfer and starts a new window. Padding the last, partial chunk with zeros keeps one
    compiled fold per kind of tree for every window length.
    """

    def __init__(self, chunk: int = 32):
        if chunk < 1:
            raise ValueError(f"DeviceSums: chunk must be >= 1, got {chunk}")
        self.chunk = chunk
        self._slots: list[Any] = [None] * chunk
        self._filled = 0
        self._count = 0
        self._stacked = False  # the kind of tree in the slots
        self._sums: Any = None
        self._structure: Any = None
        self._padding: dict[bool, Any] = {}
        self._fold: Any = None
        self._make_zeros: Any = None

    @property
    def count(self) -> int:
        """Steps added since the last ``read``."""
        return self._count

    def add(self, tree: Any, stacked: bool = False) -> None:
        """One step's tree, or with ``stacked`` several steps' trees stacked along a leading
        axis (a multi-step call's statistics: ``dew.training.steps.make_multi_step``)."""
        if self._filled and stacked != self._stacked:
            self._flush()  # a chunk holds trees of one kind
        self._stacked = stacked
        self._slots[self._filled] = tree
        self._filled += 1
        self._count += jax.tree.leaves(tree)[0].shape[0] if stacked else 1
        if self._filled == self.chunk:
            self._flush()

    def _flush(self) -> None:
        if not self._filled:
            return
        first, stacked = self._slots[0], self._stacked
        if self._fold is None or self._structure != jax.tree.structure(first):
            # The sums stay where the statistics are: the same placement in and out of every
            # fold keeps each call on jit's fast path (no re-dispatch through Python). Zeros
            # are made on the devices from the arrays themselves, not sent from the host: with
            # several processes the statistics are global arrays.
            placement = jax.tree.map(_sharding, first)
            self._make_zeros = typed_jax.jit(_zeros, static_argnums=1, out_shardings=placement)
            self._fold = typed_jax.jit(_fold, static_argnums=2, donate_argnums=0, out_shardings=placement)
            self._structure, self._padding = jax.tree.structure(first), {}
        if stacked not in self._padding or _shapes(self._padding[stacked]) != _shapes(first):
            # The last, partial chunk is padded with zeros of the chunk's own shapes: one
            # compiled fold per kind of tree (one step's, or one multi-step call's).
            placement = jax.tree.map(_sharding, first)
            self._padding[stacked] = typed_jax.jit(_zeros_like, out_shardings=placement)(first)
        sums = self._sums if self._sums is not None else self._make_zeros(first, stacked)
        chunk = self._slots[: self._filled] + [self._padding[stacked]] * (self.chunk - self._filled)
        self._sums = self._fold(sums, chunk, stacked)
        self._slots[: self._filled] = [None] * self._filled
        self._filled = 0

    def read(self) -> tuple[Any, int]:
        """The window's sums (host arrays, one transfer: float64 for floating statistics, int64
        for counts) and how many trees they cover; the next ``add`` starts a new window."""
        self._flush()
        count, self._count = self._count, 0
        if self._sums is None:
            return None, count
        sums, self._sums = jax.device_get(self._sums), None
        return jax.tree.map(_host, sums), count

    def means(self, counted: frozenset[str] = frozenset()) -> tuple[dict[str, float], int]:
        """``read()`` as plain floats: the window mean of each statistic, except the ``counted``
        ones (flags), which are summed."""
        sums, count = self.read()
        if not count:
            return {}, 0
        return {
            k: float(v.sum()) if k in counted else float(v.mean()) / count for k, v in sums.items()
        }, count


__all__ = ["DeviceSums"]
