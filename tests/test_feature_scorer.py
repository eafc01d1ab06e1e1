"""``dew.scoring.feature_scorer``: the statistics stream, the reference an environment variable
names and the batched Fréchet distance that ``InceptionScorer`` and ``DINOv2Scorer`` share."""

from __future__ import annotations

import numpy as np
import pytest

from dew.scoring import distances
from dew.scoring.feature_scorer import FeatureScorer, batches, frechet_to, reference_from_env
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
    assert scorer.calls == [(5, (-1.0, 1.0)), (4, (-1.0, 1.0))]  # batches of 5, values in [-1, 1]
    assert expected > 0 and got == expected  # the same statistics through the same distance


def test_a_missing_reference_says_what_to_set(monkeypatch):
    monkeypatch.delenv("DEW_TEST_REFERENCE", raising=False)
    with pytest.raises(FileNotFoundError, match=r"^set DEW_TEST_REFERENCE to an \.npz$"):
        reference_from_env("DEW_TEST_REFERENCE", "set DEW_TEST_REFERENCE to an .npz")
    monkeypatch.setenv("DEW_TEST_REFERENCE", "")
    with pytest.raises(FileNotFoundError, match="DEW_TEST_REFERENCE"):
        reference_from_env("DEW_TEST_REFERENCE", "set DEW_TEST_REFERENCE to an .npz")
