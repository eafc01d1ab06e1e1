"""``dew.scoring.feature_scorer``: the statistics stream, the reference an environment variable
names and the batched Fréchet distance that ``InceptionScorer`` and ``DINOv2Scorer`` share."""

from __future__ import annotations

import numpy as np
import pytest

from dew.scoring import distances
from dew.scoring.feature_scorer import (
    FeatureScorer,
    batches,
    fixed_batches,
    frechet_to,
    reference_from_env,
    statistics_over,
)
from dew.scoring.statistics import feature_statistics, save_statistics


class ChannelMoments(FeatureScorer):
    """Per-channel mean and mean square of each image: a 6-wide feature, recording its calls."""

    def __init__(self):
        self.calls = []

    def features(self, images, value_range=(-1.0, 1.0)):
        self.calls.append((len(images), value_range))
        x = np.asarray(images, np.float64)
        return np.concatenate([x.mean(axis=(1, 2)), (x**2).mean(axis=(1, 2))], axis=1)


def _images(n, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, 4, 4, 3)).astype(np.float32)


def test_batches_cover_every_image_once_in_order():
    images = _images(7)
    parts = list(batches(images, 3))
    assert [len(p) for p in parts] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate(parts), images)


def test_streamed_statistics_and_frechet_distance_match_one_array(tmp_path, monkeypatch):
    images, real = _images(9), _images(12, seed=1)
    scorer = ChannelMoments()
    stats = scorer.statistics(batches(images, 4), value_range=(0.0, 1.0), keep_features=2)
    assert scorer.calls == [(4, (0.0, 1.0)), (4, (0.0, 1.0)), (1, (0.0, 1.0))]
    mu, sigma = feature_statistics(scorer.features(images))
    # each entry: float64 sums over 9 rows of terms below 1 in magnitude, merged over 3 batches,
    # so its rounding error stays below (9 + 3 * 3) * eps; 64 * eps bounds it with room to spare
    np.testing.assert_allclose(stats.mu, mu, rtol=0, atol=64 * np.finfo(np.float64).eps)
    np.testing.assert_allclose(stats.sigma, sigma, rtol=0, atol=64 * np.finfo(np.float64).eps)
    np.testing.assert_array_equal(stats.features, scorer.features(images[:2]).astype(np.float32))

    ref_mu, ref_sigma = feature_statistics(scorer.features(real))
    save_statistics(tmp_path / "ref.npz", ref_mu, ref_sigma)
    monkeypatch.setenv("DEW_TEST_REFERENCE", str(tmp_path / "ref.npz"))
    ref = reference_from_env("DEW_TEST_REFERENCE", "set DEW_TEST_REFERENCE")
    by_five = ChannelMoments().statistics(batches(images, 5))
    expected = distances.frechet_distance(by_five.mu, by_five.sigma, ref_mu, ref_sigma)
    scorer = ChannelMoments()
    got = frechet_to(scorer, images, ref, batch_size=5)
    # batches of 5, the last padded (one batch shape), values in [-1, 1]
    assert scorer.calls == [(5, (-1.0, 1.0)), (5, (-1.0, 1.0))]
    assert expected > 0 and got == expected  # the same statistics through the same distance
    scorer = ChannelMoments()
    frechet_to(scorer, images, ref, batch_size=100)
    assert scorer.calls == [(9, (-1.0, 1.0))]  # a batch larger than the set: the set, not padded to it


def test_fixed_batches_regroup_the_rows_in_order_and_pad_the_last():
    images = _images(11)
    cuts = [images[0:3], images[3:3], images[3:8], images[8:9], images[9:11]]  # 3, 0, 5, 1, 2 rows
    grouped = list(fixed_batches(cuts, 4))
    assert [(len(rows), n) for rows, n in grouped] == [(4, 4), (4, 4), (4, 3)]
    np.testing.assert_array_equal(np.concatenate([rows[:n] for rows, n in grouped]), images)
    np.testing.assert_array_equal(grouped[-1][0][3], images[-1])  # the padding repeats the last row
    assert list(fixed_batches([images[:8]], 4))[-1][1] == 4  # an exact multiple: no padded batch
    # a set smaller than one batch is one array of its own size, never padded past it
    small = list(fixed_batches([images[:2], images[2:3]], 4))
    assert [(len(rows), n) for rows, n in small] == [(3, 3)]
    np.testing.assert_array_equal(small[0][0], images[:3])
    assert [(len(rows), n) for rows, n in fixed_batches([images], 11)] == [(11, 11)]
    assert list(fixed_batches([], 4)) == []
    with pytest.raises(ValueError, match="size must be >= 1"):
        list(fixed_batches(cuts, 0))


def test_statistics_over_a_batch_size_shows_each_scorer_one_batch_shape():
    """However the source cuts its images (a run's draws, a folder's last batch), each scorer is
    called at one shape, so it compiles one program; the statistics are those of every row once."""
    images = _images(11)
    cuts = [images[0:3], images[3:8], images[8:9], images[9:11]]
    a, b = ChannelMoments(), ChannelMoments()
    stats = statistics_over({"a": a, "b": b}, iter(cuts), (0.0, 1.0), {"a": 11}, batch_size=4)
    assert a.calls == b.calls == [(4, (0.0, 1.0))] * 3
    assert stats["a"].count == stats["b"].count == 11
    mu, sigma = feature_statistics(a.features(images))
    # float64 sums over 11 rows of terms below 1, merged over 3 batches: error below
    # (11 + 3 * 3) * eps; 64 * eps bounds it with room to spare
    for name in ("a", "b"):
        np.testing.assert_allclose(stats[name].mu, mu, rtol=0, atol=64 * np.finfo(np.float64).eps)
        np.testing.assert_allclose(stats[name].sigma, sigma, rtol=0, atol=64 * np.finfo(np.float64).eps)
    np.testing.assert_array_equal(stats["a"].features, a.features(images).astype(np.float32))
    unbatched = ChannelMoments()
    statistics_over({"a": unbatched}, iter(cuts), (0.0, 1.0))
    assert [n for n, _ in unbatched.calls] == [3, 5, 1, 2]  # without a batch size, as given


def test_a_missing_reference_says_what_to_set(monkeypatch):
    monkeypatch.delenv("DEW_TEST_REFERENCE", raising=False)
    with pytest.raises(FileNotFoundError, match=r"^set DEW_TEST_REFERENCE to an \.npz$"):
        reference_from_env("DEW_TEST_REFERENCE", "set DEW_TEST_REFERENCE to an .npz")
    monkeypatch.setenv("DEW_TEST_REFERENCE", "")
    with pytest.raises(FileNotFoundError, match="DEW_TEST_REFERENCE"):
        reference_from_env("DEW_TEST_REFERENCE", "set DEW_TEST_REFERENCE to an .npz")
