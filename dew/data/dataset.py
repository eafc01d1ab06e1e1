"""``Dataset``: seeded epoch permutations over a random-access source, one share per process."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy import take  # np.take gathers rows 2-4x faster than fancy indexing (``v[rows]``)

from dew.data.feed import AheadFeed, ThreadFeed


@dataclasses.dataclass(frozen=True)
class Source:
    """Whole arrays of one split, keyed by batch field name, all with the same leading size.

    A field may also be any array-like with ``shape``, ``dtype``, ``len`` and row indexing by an
    index array (a lazily read column, as the tfds sources use). ``sample_field`` names the field a
    generative model learns; ``class_prompts`` (optional) is one text prompt per class, for
    text-conditioned previews of a labelled source. ``prefetch`` is how many batches a
    ``Dataset`` prepares ahead on a background thread by default (lazily read sources set it).
    """

    name: str
    fields: Mapping[str, np.ndarray]
    num_classes: int | None = None
    sample_field: str = "image"
    class_prompts: tuple[str, ...] | None = None
    prefetch: int = 0

    def __post_init__(self) -> None:
        sizes = {k: len(v) for k, v in self.fields.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"Source {self.name!r}: fields differ in length: {sizes}")

    def __len__(self) -> int:
        return len(next(iter(self.fields.values())))


@dataclasses.dataclass(frozen=True)
class DataPartition:
    """Which share of the data this process reads: share ``index`` of ``count``."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"DataPartition: index must be in [0, {self.count}), got {self.index}")


class _Position(NamedTuple):
    """Where the stream stands: the next batch is batch ``batch`` of epoch ``epoch``."""

    epoch: int
    batch: int


#: From this many rows on, the next epoch's order is computed on a helper thread (a permutation
#: takes ~12 ns a row at 20k rows, ~40 ns at 200k-2M once it leaves the cache: 90 ms, a stall
#: at each epoch boundary otherwise). Below it the permutation takes under ~1 ms once per epoch
#: (~3 µs a batch, amortised) and a thread would cost more than it hides.
BACKGROUND_ORDER_ROWS = 1 << 16


class _EpochOrders:
    """This share's visiting order of each epoch, computed once per epoch: O(rows) then, and
    O(batch) per batch after (amortised, O(batch) too: an epoch has rows / batch batches).
    For large sources the next epoch's order is computed on a helper thread while the current
    one is read (numpy's permutation releases the GIL), so crossing an epoch costs no stall.
    Holds at most the current and the next epoch's order."""

    def __init__(self, rows: int, seed: int, share: DataPartition, shuffle: bool):
        self.rows, self.seed, self.share, self.shuffle = rows, seed, share, shuffle
        self._epoch, self._order = -1, np.empty(0, np.intp)
        self._next: tuple[int, threading.Thread, list[np.ndarray]] | None = None

    def compute(self, epoch: int) -> np.ndarray:
        """The order of ``epoch`` (the same whichever thread computes it)."""
        n, share = self.rows, self.share
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        return order[share.index :: share.count] if share.count > 1 else order

    def __call__(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            pending, self._next = self._next, None
            if pending is not None and pending[0] == epoch:
                pending[1].join()
                self._order = pending[2][0]
            else:
                if pending is not None:
                    pending[1].join()
                self._order = self.compute(epoch)
            self._epoch = epoch
            if self.shuffle and self.rows >= BACKGROUND_ORDER_ROWS:
                out: list[np.ndarray] = []
                thread = threading.Thread(
                    target=lambda: out.append(self.compute(epoch + 1)), name="dew-epoch-order", daemon=True
                )
                thread.start()
                self._next = (epoch + 1, thread, out)
        return self._order


class Dataset:
    """Opens the batches a run trains and validates on.

    Epoch ``e`` visits the examples in ``permutation(seed, e)``; process ``share.index`` takes
    every ``share.count``-th example of it, and batches never straddle epochs (the remainder is
    dropped so every batch has the same shape and every process the same number of batches).
    The order is computed once per epoch, so a batch costs O(batch) whatever the source's size.

    ``prefetch`` batches are prepared ahead on a background thread (default: the source's own
    ``prefetch``: lazily read sources such as tfds decode there while the device computes;
    in-memory arrays need none). ``place`` (e.g. ``Layout.place_batch``) puts each batch on the
    devices ``ahead`` batches before it is handed out, so its copy overlaps earlier steps.
    Neither changes what is read: the position (``save_position``) is always the one after the
    last batch handed out, and ``read_position`` drops what was prepared ahead. ``close()`` stops
    the background thread (a new ``next`` starts it again).
    """

    def __init__(
        self,
        source: Source,
        batch_size: int,
        *,
        seed: int = 0,
        share: DataPartition | None = None,
        shuffle: bool = True,
        prefetch: int | None = None,
        place: Callable[[dict[str, np.ndarray]], Any] | None = None,
        ahead: int = 1,
    ):
        self.source = source
        self.share = share or DataPartition()
        self.seed = seed
        self.shuffle = shuffle
        per_share = len(source) // self.share.count
        if batch_size < 1 or batch_size > per_share:
            raise ValueError(
                f"Dataset {source.name!r}: batch_size must be in [1, {per_share}] "
                f"(examples per share), got {batch_size}"
            )
        self.prefetch = source.prefetch if prefetch is None else prefetch
        if self.prefetch < 0 or ahead < 1:
            raise ValueError(
                f"Dataset {source.name!r}: prefetch must be >= 0 and ahead >= 1, got {self.prefetch}, {ahead}"
            )
        self.place, self.ahead = place, ahead
        self.batch_size = batch_size
        self.batches_per_epoch = per_share // batch_size
        self._position = _Position(0, 0)
        self._orders = _EpochOrders(len(source), seed, self.share, shuffle)
        self._feed: ThreadFeed[_Position] | AheadFeed[_Position] | None = None

    # --- position: what a checkpoint stores --------------------------------------------------
    def save_position(self) -> bytes:
        """The stream position as JSON bytes (what ``Checkpoints.save`` stores)."""
        return json.dumps(self._position._asdict(), sort_keys=True).encode()

    def read_position(self, saved: bytes) -> None:
        """Continue from a position ``save_position`` returned; refuses anything else."""
        try:
            fields = json.loads(bytes(saved).decode())
            position = _Position(epoch=int(fields["epoch"]), batch=int(fields["batch"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"Dataset {self.source.name!r}: unreadable position {saved[:80]!r}: {e}") from e
        if position.epoch < 0 or not 0 <= position.batch < self.batches_per_epoch:
            raise ValueError(f"Dataset {self.source.name!r}: position {fields} is out of range")
        self.close()
        self._position = position

    # --- the stream -------------------------------------------------------------------------
    def _produce(self, p: _Position) -> tuple[dict[str, np.ndarray], _Position]:
        start = p.batch * self.batch_size
        rows = self._orders(p.epoch)[start : start + self.batch_size]
        batch = {
            k: take(v, rows, axis=0) if type(v) is np.ndarray else v[rows]
            for k, v in self.source.fields.items()
        }
        following = p.batch + 1
        return batch, (
            _Position(p.epoch, following) if following < self.batches_per_epoch else _Position(p.epoch + 1, 0)
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._feed is None:
            if not self.prefetch and self.place is None:
                batch, self._position = self._produce(self._position)
                return batch
            self._feed = (
                ThreadFeed(
                    self._produce, self._position, self.prefetch, self.place, f"dew-feed-{self.source.name}"
                )
                if self.prefetch
                else AheadFeed(self._produce, self._position, self.ahead, self.place)
            )
        batch, self._position = self._feed.next()
        return batch

    def set_placement(self, place: Callable[[dict[str, np.ndarray]], Any] | None, ahead: int = 1) -> None:
        """Hand out batches through ``place`` (``None``: host arrays), ``ahead`` placed in advance.
        What was prepared for the previous placement is dropped; the position is unchanged."""
        if ahead < 1:
            raise ValueError(f"Dataset {self.source.name!r}: ahead must be >= 1, got {ahead}")
        self.close()
        self.place, self.ahead = place, ahead

    def close(self) -> None:
        """Stop preparing batches ahead (the background thread, if any, ends here)."""
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_first(self, num_batches: int) -> None:
        """Raise ``ValueError`` unless ``first(num_batches)`` fits the source (reads nothing)."""
        share, size = self.share, self.batch_size
        fit = (len(self.source) - share.index + share.count - 1) // share.count // size
        if num_batches > fit:
            raise ValueError(f"Dataset {self.source.name!r}: asked for {num_batches} batches, only {fit} fit")

    def first(self, num_batches: int) -> list[dict[str, np.ndarray]]:
        """The first ``num_batches`` batches in source order, for a fixed evaluation prefix."""
        self.check_first(num_batches)
        share, size = self.share, self.batch_size
        return [
            {
                k: v[np.arange(i * size, (i + 1) * size) * share.count + share.index]
                for k, v in self.source.fields.items()
            }
            for i in range(num_batches)
        ]
