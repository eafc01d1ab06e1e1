"""Batches prepared ahead of use: a background producer thread, and device placement ahead.

A ``Dataset`` produces batch ``n`` from its position alone (``produce(position) -> (batch,
next_position)``), so work can run ahead of the consumer without changing what it reads: each
prepared batch travels with the position *after* it, and the consumer's position (what a
checkpoint stores) becomes that position only when the batch is handed out. Stopping a feed
throws away what was prepared ahead; restarting it from the consumer's position reproduces
exactly the same batches.

``ThreadFeed`` runs ``produce`` (and ``place``, e.g. a ``jax.device_put``) on one daemon thread,
at most ``depth`` batches ahead, so the host prepares batch n+1 (a lazily read source's decode,
crop and resize) while the device runs batch n. ``AheadFeed`` does the same on the calling
thread: it keeps ``depth`` batches already placed (their host-to-device copies under way) before
the one handed out is used.
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

P = TypeVar("P")
Produce = Callable[[P], tuple[Any, P]]
Place = Callable[[Any], Any]

_LIVE: weakref.WeakSet[ThreadFeed] = weakref.WeakSet()


class _Failed:
    """What the producer thread hands over instead of a batch when ``produce`` raised."""

    def __init__(self, error: BaseException):
        self.error = error


class ThreadFeed(Generic[P]):
    """``produce`` (then ``place``) run on a daemon thread from ``start``, ``depth`` batches ahead.

    ``next()`` returns ``(batch, position_after_it)`` in order; an error raised while producing is
    raised by the ``next()`` that would have returned that batch. ``close()`` stops the thread and
    waits for it (at most the time of one ``produce``); it is idempotent, and an interpreter exit
    closes every feed still open.
    """

    def __init__(
        self, produce: Produce[P], start: P, depth: int, place: Place | None = None, name: str = "dew-feed"
    ):
        if depth < 1:
            raise ValueError(f"ThreadFeed: depth must be >= 1, got {depth}")
        self._queue: queue.Queue[tuple[Any, P] | _Failed] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(produce, start, place), name=name, daemon=True
        )
        self._closed = False
        _LIVE.add(self)
        self._thread.start()

    def _run(self, produce: Produce[P], position: P, place: Place | None) -> None:
        while not self._stop.is_set():
            try:
                batch, position = produce(position)
                if place is not None:
                    batch = place(batch)
                item: tuple[Any, P] | _Failed = (batch, position)
            except BaseException as e:  # handed to the consumer, raised where it reads this batch
                item = _Failed(e)
            self._queue.put(item)  # close() drains the queue, so a blocked put always returns
            if isinstance(item, _Failed):
                return

    def next(self) -> tuple[Any, P]:
        if self._closed:
            raise RuntimeError("ThreadFeed: next() after close()")
        item = self._queue.get()
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        while self._thread.is_alive():
            try:  # make room, so a producer blocked in put() wakes, sees the stop and returns
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)
        _LIVE.discard(self)


class AheadFeed(Generic[P]):
    """``produce`` and ``place`` on the calling thread, ``depth`` placed batches kept ahead.

    The batch handed out was placed ``depth`` calls earlier, so with an asynchronous ``place``
    (``jax.device_put``) its copy ran while earlier steps computed. Nothing to stop: ``close``
    only drops what was prepared.
    """

    def __init__(self, produce: Produce[P], start: P, depth: int, place: Place | None = None):
        if depth < 1:
            raise ValueError(f"AheadFeed: depth must be >= 1, got {depth}")
        self._produce, self._place, self._position, self._depth = produce, place, start, depth
        self._ready: collections.deque[tuple[Any, P]] = collections.deque()

    def _fill(self) -> None:
        while len(self._ready) <= self._depth:
            batch, self._position = self._produce(self._position)
            self._ready.append((batch if self._place is None else self._place(batch), self._position))

    def next(self) -> tuple[Any, P]:
        self._fill()
        return self._ready.popleft()

    def close(self) -> None:
        self._ready.clear()


@atexit.register
def _close_all() -> None:
    for feed in list(_LIVE):
        feed.close()
