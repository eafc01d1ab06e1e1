"""``Dataset``: seeded epoch permutations over a random-access source, one share per process."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class Source:
    """Whole arrays of one split, keyed by batch field name, all with the same leading size.

    A field may also be any array-like with ``shape``, ``dtype``, ``len`` and row indexing by an
    index array (a lazily read column, as the tfds sources use). ``sample_field`` names the field a
    generative model learns; ``class_prompts`` (optional) is one text prompt per class, for
    text-conditioned previews of a labelled source.
    """

    name: str
    fields: Mapping[str, np.ndarray]
    num_classes: int | None = None
    sample_field: str = "image"
    class_prompts: tuple[str, ...] | None = None

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


@dataclasses.dataclass
class _Position:
    epoch: int = 0
    batch: int = 0


class Dataset:
    """Opens the batches a run trains and validates on.

    Epoch ``e`` visits the examples in ``permutation(seed, e)``; process ``share.index`` takes
    every ``share.count``-th example of it, and batches never straddle epochs (the remainder is
    dropped so every batch has the same shape and every process the same number of batches).
    """

    def __init__(
        self,
        source: Source,
        batch_size: int,
        *,
        seed: int = 0,
        share: DataPartition | None = None,
        shuffle: bool = True,
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
        self.batch_size = batch_size
        self.batches_per_epoch = per_share // batch_size
        self._position = _Position()

    # --- position: what a checkpoint stores --------------------------------------------------
    def save_position(self) -> bytes:
        """The stream position as JSON bytes (what ``Checkpoints.save`` stores)."""
        return json.dumps(dataclasses.asdict(self._position), sort_keys=True).encode()

    def read_position(self, saved: bytes) -> None:
        """Continue from a position ``save_position`` returned; refuses anything else."""
        try:
            fields = json.loads(bytes(saved).decode())
            position = _Position(epoch=int(fields["epoch"]), batch=int(fields["batch"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"Dataset {self.source.name!r}: unreadable position {saved[:80]!r}: {e}") from e
        if position.epoch < 0 or not 0 <= position.batch < self.batches_per_epoch:
            raise ValueError(f"Dataset {self.source.name!r}: position {fields} is out of range")
        self._position = position

    # --- the stream -------------------------------------------------------------------------
    def _order(self, epoch: int) -> np.ndarray:
        n = len(self.source)
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        return order[self.share.index :: self.share.count]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        p = self._position
        rows = self._order(p.epoch)[p.batch * self.batch_size : (p.batch + 1) * self.batch_size]
        batch = {k: v[rows] for k, v in self.source.fields.items()}
        p.batch += 1
        if p.batch == self.batches_per_epoch:
            p.epoch, p.batch = p.epoch + 1, 0
        return batch

    def first(self, num_batches: int) -> list[dict[str, np.ndarray]]:
        """The first ``num_batches`` batches in source order, for a fixed evaluation prefix."""
        order = np.arange(len(self.source))[self.share.index :: self.share.count]
        if num_batches > len(order) // self.batch_size:
            raise ValueError(
                f"Dataset {self.source.name!r}: asked for {num_batches} batches, "
                f"only {len(order) // self.batch_size} fit"
            )
        return [
            {
                k: v[order[i * self.batch_size : (i + 1) * self.batch_size]]
                for k, v in self.source.fields.items()
            }
            for i in range(num_batches)
        ]
