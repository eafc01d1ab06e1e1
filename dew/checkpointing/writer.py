"""The asynchronous writer: checkpoint writes on one background thread, off the loop's path.

The loop pays only for a device-side copy of the state (``snapshot``; the jitted step donates
its input buffers, so the writer must not read the live ones). One write is in flight at most:
``submit`` waits for the one before it, so at most one copy is held and a failed write stops
the next save. ``wait`` re-raises the first failure: a checkpoint that did not land is data
loss, so its error reaches the caller.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dew.contracts.state import TrainState


class Writer:
    """Runs writes on one thread (``asynchronous=True``) or inline (``False``)."""

    def __init__(self, asynchronous: bool = True):
        self.asynchronous = asynchronous
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: list[concurrent.futures.Future] = []
        self._labels: dict[concurrent.futures.Future, Any] = {}
        self._abandoned = False

    def submit(self, write: Callable[..., None], *args: Any, label: Any = None) -> None:
        """Run ``write(*args)`` after every earlier write has landed (inline when synchronous);
        ``label`` (e.g. the step) is what ``pending`` reports while the write is unfinished."""
        self.wait()
        if not self.asynchronous:
            write(*args)
            return
        if self._pool is None:
            # at the loop's priority: a write that goes through orbax lowers it (``yield_to_the_loop``)
            self._pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="dew-checkpoints", initializer=checkpoint_thread
            )
        future = self._pool.submit(write, *args)
        self._inflight.append(future)
        self._labels[future] = label

    @property
    def busy(self) -> bool:
        """Whether a write is queued or running (never blocks)."""
        return any(not f.done() for f in self._inflight)

    @property
    def pending(self) -> list[Any]:
        """The labels of the writes queued or running, oldest first (never blocks)."""
        return [self._labels[f] for f in self._inflight if not f.done()]

    def wait(self) -> None:
        """Block until every submitted write has finished; re-raise the first that failed."""
        while self._inflight:
            future = self._inflight[0]
            try:
                future.result()
            finally:  # a failed write is dropped (raised once); one still running stays pending
                if future.done():
                    self._inflight.pop(0)
                    self._labels.pop(future, None)

    def abandon(self) -> None:
        """Stop waiting for the writes in flight: later waits return at once. Only for a process
        about to exit (a second Ctrl-C): the write goes on in its thread until then, and one
        that does not finish leaves an unfinished directory that the next writer cleans up."""
        self._inflight.clear()
        self._labels.clear()
        self._abandoned = True

    def close(self) -> None:
        """Wait, then stop the thread (also when a write failed: its error is raised)."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=not self._abandoned)
                self._pool = None


#: How much lower than the loop's the scheduling priority of a thread writing through orbax is
#: (Linux ``nice`` steps; 0: the same). The threads a write starts inherit it. With every core
#: busy training, orbax's write (much of it in tensorstore's threads, off the GIL) takes the
#: cycles the loop leaves rather than half of the loop's. A small state's direct write
#: (``direct_write``) stays at the loop's priority: it is mostly Python, holding the GIL, and a
#: thread preempted while holding it stalls the loop (a save every 3 steps of ~20 ms cost the loop
#: 408 ms per save niced, 155 ms not: benchmarks/RESULTS.md).
WRITER_NICENESS = 10
_thread = threading.local()


def checkpoint_thread(lowered: bool = False) -> None:
    """Mark this thread as a checkpoint thread (the writer's, the remover's: their pools'
    initializer), its priority lowered at once with ``lowered=True``."""
    _thread.checkpoint = True
    if lowered:
        yield_to_the_loop()


def yield_to_the_loop() -> None:
    """Lower this checkpoint thread's priority to ``WRITER_NICENESS`` below the loop's, once (a
    thread cannot raise it again unprivileged), where the platform lets a thread do so (Linux: a
    thread id is a ``setpriority`` target). Nothing on any other thread: a synchronous save runs
    on the loop's."""
    if not WRITER_NICENESS or not hasattr(os, "setpriority") or not getattr(_thread, "checkpoint", False):
        return
    if getattr(_thread, "lowered", False):
        return
    _thread.lowered = True
    try:
        tid = threading.get_native_id()
        lowered = min(_LOOP_NICENESS + WRITER_NICENESS, 19)  # a thread started by a lowered one has it
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), lowered))
    except OSError:
        pass


#: The niceness of the thread that imported this module (the loop's), which the lowered one is relative to.
_LOOP_NICENESS = (
    os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "setpriority") else 0
)


def snapshot(state: TrainState) -> TrainState:
    """A copy of the state's arrays, dispatched (not waited for) on their own devices.

    The copy is queued on the devices and the loop goes on; host leaves are copied on the host.
    """
    leaves, treedef = jax.tree.flatten(state)
    on_device = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    copies = jax.device_put(
        [leaves[i] for i in on_device], [leaves[i].sharding for i in on_device], may_alias=False
    )
    out = [x if isinstance(x, jax.Array) else np.array(x, copy=True) for x in leaves]
    for i, copy in zip(on_device, copies, strict=True):
        out[i] = copy
    return jax.tree.unflatten(treedef, out)


def host_copy(leaf: Any) -> Any:
    """A copy of an array leaf on the host, taken now (the caller may mutate or donate it);
    numbers and strings as they are."""
    return np.array(leaf) if isinstance(leaf, jax.Array | np.ndarray) else leaf
