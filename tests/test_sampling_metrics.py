"""The sample-quality measures the sampling results rest on: sliced Wasserstein and the digit
feature Fréchet distance."""

from __future__ import annotations

import numpy as np
import pytest

import dew
from dew.data.sources.digits import digits
from dew.scoring.digits_features import digits_frechet_distance, frechet_distance
from dew.scoring.sliced_wasserstein import sliced_wasserstein


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
    assert digits_frechet_distance(real) < 1.0 < 20.0 < digits_frechet_distance(noise)
