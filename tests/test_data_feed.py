"""The dataset at scale: one order per epoch, batches prepared ahead on a thread or placed ahead,
and the position exactly resumable through all of it."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from dew.data import DataPartition, Dataset, Source
from dew.data import dataset as dataset_lib
from dew.data.feed import ThreadFeed


def source(n: int = 50, prefetch: int = 0) -> Source:
    return Source("toy", {"x": np.arange(n, dtype=np.float32), "y": np.arange(n) % 3}, prefetch=prefetch)


def take(dataset: Dataset, k: int) -> list[np.ndarray]:
    return [np.asarray(next(dataset)["x"]) for _ in range(k)]


def feed_threads() -> list[threading.Thread]:
    """This file's feed threads (its sources are named "toy"), not another test's in the process."""
    return [t for t in threading.enumerate() if t.name.startswith("dew-feed-toy")]


def test_the_order_is_the_seeded_permutation_of_each_epoch_and_share():
    # The documented order (and the one earlier runs read): permutation(seed, epoch), every
    # share.count-th row for share.index, batches in order, the remainder dropped.
    data = Dataset(source(50), 4, seed=7, share=DataPartition(1, 3))
    got = np.concatenate(take(data, 2 * data.batches_per_epoch))
    expected = [
        np.random.default_rng([7, e]).permutation(50)[1::3][: 4 * data.batches_per_epoch] for e in (0, 1)
    ]
    np.testing.assert_array_equal(got, np.concatenate(expected).astype(np.float32))


@pytest.mark.parametrize("background", [False, True])
def test_each_epoch_order_is_computed_once(monkeypatch, background):
    calls: list[int] = []
    compute = dataset_lib._EpochOrders.compute

    def counting(self, epoch):
        calls.append(epoch)
        return compute(self, epoch)

    monkeypatch.setattr(dataset_lib._EpochOrders, "compute", counting)
    monkeypatch.setattr(dataset_lib, "BACKGROUND_ORDER_ROWS", 48 if background else 49)
    data = Dataset(source(48), 4, seed=0)
    plain = [np.random.default_rng([0, e]).permutation(48).astype(np.float32) for e in range(3)]
    np.testing.assert_array_equal(np.concatenate(take(data, 36)), np.concatenate(plain))  # 3 epochs
    # Once each, not once per batch; a large source also computes epoch 3 ahead on a helper thread.
    assert sorted(calls) == ([0, 1, 2, 3] if background else [0, 1, 2])


@pytest.mark.parametrize("options", [{}, {"prefetch": 3}, {"place": jax.device_put, "ahead": 2}])
def test_resuming_mid_epoch_continues_exactly(options):
    straight = Dataset(source(), 8, seed=3, **options)
    expected = take(straight, 15)  # 6 batches per epoch
    first = Dataset(source(), 8, seed=3, **options)
    head = take(first, 9)  # stops in the middle of epoch 1, with batches prepared ahead
    saved = first.save_position()
    assert saved == b'{"batch": 3, "epoch": 1}'  # what was handed out, not what was prepared
    first.close()
    resumed = Dataset(source(), 8, seed=3, **options)
    resumed.read_position(saved)
    np.testing.assert_array_equal(np.stack(head + take(resumed, 6)), np.stack(expected))
    straight.close()
    resumed.close()


def test_reading_a_position_drops_what_was_prefetched():
    data = Dataset(source(), 8, seed=5, prefetch=2)
    take(data, 4)
    data.read_position(b'{"batch": 1, "epoch": 0}')
    again = Dataset(source(), 8, seed=5)
    take(again, 1)
    np.testing.assert_array_equal(np.stack(take(data, 8)), np.stack(take(again, 8)))
    data.close()


def test_tfds_style_sources_prefetch_on_a_thread_that_close_ends():
    data = Dataset(source(prefetch=2), 8, seed=1)
    assert data.prefetch == 2
    plain = Dataset(source(), 8, seed=1)
    np.testing.assert_array_equal(np.stack(take(data, 3)), np.stack(take(plain, 3)))
    threads = feed_threads()
    assert len(threads) == 1 and threads[0].daemon
    data.close()
    assert not threads[0].is_alive() and feed_threads() == []
    take(data, 1)  # a new next() starts it again, from the position handed out
    np.testing.assert_array_equal(take(data, 1)[0], take(plain, 2)[1])
    data.close()


def test_an_error_while_prefetching_is_raised_where_that_batch_is_read():
    def produce(position: int):
        if position == 2:
            raise OSError("disk went away")
        return position, position + 1

    feed = ThreadFeed(produce, 0, depth=4)
    assert [feed.next()[0] for _ in range(2)] == [0, 1]
    with pytest.raises(OSError, match="disk went away"):
        feed.next()
    assert not feed._thread.is_alive()


def test_a_blocked_producer_is_stopped_by_close():
    feed = ThreadFeed(lambda p: (p, p + 1), 0, depth=1)
    assert feed.next() == (0, 1)
    feed.close()  # the producer is blocked on a full queue: close must wake and join it
    assert not feed._thread.is_alive()
    feed.close()  # idempotent
