"""A Fréchet distance for 8x8 digits in the feature space of a small classifier trained on them.

FID's recipe (Heusel et al. 2017) at digit scale: the feature network is the 64-unit hidden
(penultimate) ReLU layer of a one-hidden-layer MLP classifier (scikit-learn ``MLPClassifier``,
fixed seed) fitted on the 1,617 real training digits; Fréchet distance between Gaussians fitted
to the features of generated and of real digits,

    FD = ‖μ_a − μ_b‖² + Tr(Σ_a + Σ_b − 2 (Σ_a Σ_b)^{1/2}).

The reference set is all 1,797 real digits. The classifier shares nothing with the generator.
"""

from __future__ import annotations

import functools

import numpy as np

from dew import registry
from dew.data.sources.digits import load_pixels_and_labels, to_source_range, to_unit_range
from dew.scoring import distances
from dew.scoring.statistics import FeatureStatistics, feature_statistics


@functools.cache
def _classifier():
    from sklearn.neural_network import MLPClassifier

    pixels, labels = load_pixels_and_labels()
    train = np.arange(len(labels)) % 10 != 0  # the training split of dew.data.sources.digits
    return MLPClassifier(hidden_layer_sizes=(64,), max_iter=600, random_state=0).fit(
        pixels[train] / 16.0, labels[train]
    )


def digit_features(images: np.ndarray) -> np.ndarray:
    """Penultimate-layer features [N, 64] of images in [-1, 1], [N, 8, 8, 1] (clipped first)."""
    images = np.asarray(images)
    if images.shape[1:] != (8, 8, 1):
        raise ValueError(f"digit_features: images must be [N, 8, 8, 1], got {images.shape}")
    clf = _classifier()
    x = to_source_range(np.clip(images, -1, 1)) / 16.0
    return np.maximum(x @ clf.coefs_[0] + clf.intercepts_[0], 0.0)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """FD between Gaussians fitted to feature sets ``a`` [N, D] and ``b`` [M, D]: the streaming
    statistics (``dew.scoring.statistics``) and the eigh-based FD (``dew.scoring.distances``) that
    Inception FID uses too; stable when a covariance is singular, as it is when a ReLU unit
    never fires on one of the sets."""
    return distances.frechet_distance(*feature_statistics(a), *feature_statistics(b))


@functools.cache
def _real_features() -> np.ndarray:
    return digit_features(to_unit_range(load_pixels_and_labels()[0]))


@functools.cache
def _real_statistics() -> tuple[np.ndarray, np.ndarray]:
    return feature_statistics(_real_features())


def digits_frechet_distance(images: np.ndarray, labels: np.ndarray | None = None) -> float:
    """FD of generated digits to all 1,797 real digits, in the classifier's feature space."""
    return distances.frechet_distance(*feature_statistics(digit_features(images)), *_real_statistics())


def digits_kernel_distance(images: np.ndarray, labels: np.ndarray | None = None) -> float:
    """KID (mean over 100 subsets of min(1000, N) rows) of generated digits to the real digits,
    in the classifier's feature space."""
    return distances.kernel_distance(digit_features(images), _real_features())[0]


def streamed_digit_statistics(batches) -> FeatureStatistics:
    """Feature statistics of an iterable of image batches [n, 8, 8, 1], one pass."""
    stats = FeatureStatistics()
    for images in batches:
        stats.update(digit_features(images))
    return stats


def classifier_accuracy_on_real_validation() -> float:
    """The feature classifier's accuracy on the 180 held-out real digits (a sanity figure)."""
    pixels, labels = load_pixels_and_labels()
    held = np.arange(len(labels)) % 10 == 0
    return float(np.mean(_classifier().predict(pixels[held] / 16.0) == labels[held]))


registry.metrics.register("digits_frechet_distance", digits_frechet_distance)
registry.metrics.register("digits_kernel_distance", digits_kernel_distance)
