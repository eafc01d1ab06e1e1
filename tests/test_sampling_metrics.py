"""The sample-quality measures the sampling results rest on: sliced Wasserstein and the digit
feature Fréchet distance."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dew
from dew.data.sources.digits import digits, load_pixels_and_labels, to_unit_range
from dew.scoring.digits_features import digit_features, digits_frechet_distance, frechet_distance
from dew.scoring.sliced_wasserstein import sliced_wasserstein
from dew.scoring.statistics import feature_statistics


def test_sliced_wasserstein_is_zero_on_itself_and_measures_a_shift():
    a = np.random.default_rng(0).standard_normal((4000, 2))
    assert sliced_wasserstein(a, a) == 0.0
    # Shifting by d moves every projection θ·x by θ·d; E[(θ·d)²] = ‖d‖²/2 for θ uniform on the circle.
    shift = np.array([0.6, -0.8])
    assert sliced_wasserstein(a + shift, a, projections=4096) == pytest.approx(np.sqrt(0.5), rel=0.03)
    with pytest.raises(ValueError, match="equal shape"):
        sliced_wasserstein(a, a[:10])
    assert dew.metrics["sliced_wasserstein"] is sliced_wasserstein


def test_frechet_distance_matches_the_closed_form_and_ranks_digits_above_noise():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((20_000, 3))
    b = rng.standard_normal((20_000, 3)) * 2.0 + 1.0
    # N(0, I) vs N(1, 4I) in 3-D: ‖Δμ‖² + Tr(I + 4I − 2·2I) = 3 + 3.
    assert frechet_distance(a, b) == pytest.approx(6.0, rel=0.03)
    real = digits("train").fields["image"][:1000]
    noise = np.random.default_rng(2).uniform(-1, 1, (1000, 8, 8, 1))
    # Digits drowned step by step in noise move monotonically away from the real ones.
    mixed = [digits_frechet_distance((1 - t) * real + t * noise) for t in (0.0, 0.25, 0.5, 1.0)]
    assert all(a < b for a, b in itertools.pairwise(mixed)), mixed
    # A point mass at the mean feature of the 1,797 reference digits lies at FD = Tr Σ_real from
    # them (no mean term, no root term): real digits must be closer than that, noise farther.
    _, sigma_real = feature_statistics(digit_features(to_unit_range(load_pixels_and_labels()[0])))
    collapsed = float(np.trace(sigma_real))
    assert mixed[0] < collapsed < mixed[-1], (mixed, collapsed)
