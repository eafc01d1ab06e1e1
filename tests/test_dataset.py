from __future__ import annotations

import numpy as np
import pytest

from dew.data import DataPartition, Dataset, Source


def source(n: int = 50) -> Source:
    return Source("toy", {"x": np.arange(n, dtype=np.float32), "y": np.arange(n) % 3}, num_classes=3)


def take(dataset: Dataset, k: int) -> list[np.ndarray]:
    return [next(dataset)["x"] for _ in range(k)]


def test_a_stream_resumed_from_its_position_continues_exactly():
    straight = Dataset(source(), 8, seed=3)
    expected = take(straight, 20)  # 6 batches per epoch: crosses three epoch boundaries
    first = Dataset(source(), 8, seed=3)
    head = take(first, 7)
    saved = first.save_position()
    resumed = Dataset(source(), 8, seed=3)
    resumed.read_position(saved)
    got = head + take(resumed, 13)
    np.testing.assert_array_equal(np.stack(got), np.stack(expected))


def test_epochs_are_reshuffled_permutations_without_repeats():
    dataset = Dataset(source(48), 8, seed=0)
    epoch0, epoch1 = np.concatenate(take(dataset, 6)), np.concatenate(take(dataset, 6))
    assert sorted(epoch0) == list(range(48)) == sorted(epoch1)
    assert not np.array_equal(epoch0, epoch1)


def test_shares_are_disjoint_and_cover_the_epoch():
    shares = [Dataset(source(48), 4, seed=1, share=DataPartition(i, 3)) for i in range(3)]
    seen = np.concatenate([np.concatenate(take(d, 4)) for d in shares])
    assert sorted(seen) == list(range(48))


def test_bad_positions_and_sizes_are_refused():
    dataset = Dataset(source(), 8)
    with pytest.raises(ValueError, match="unreadable position"):
        dataset.read_position(b"not json")
    with pytest.raises(ValueError, match="out of range"):
        dataset.read_position(b'{"epoch": 0, "batch": 99}')
    with pytest.raises(ValueError, match=r"batch_size must be in \[1, 50\]"):
        Dataset(source(), 64)
    with pytest.raises(ValueError, match="index must be in"):
        DataPartition(3, 3)
