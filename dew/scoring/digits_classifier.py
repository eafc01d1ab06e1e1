"""Do class-conditional digit samples show the digit they were asked for?

An independent judge: an RBF support-vector classifier fitted on all 1,797 real digits (the
standard scikit-learn recipe, ~99% cross-validated accuracy). It shares nothing with the
generator, so its agreement with the requested labels measures conditional sample quality.
"""

from __future__ import annotations

import functools

import numpy as np

from dew import registry
from dew.data.sources.digits import load_pixels_and_labels, to_source_range
from dew.registry import Metric


@functools.cache
def _classifier():
    from sklearn.svm import SVC

    # SVC's gamma is unannotated and pyright infers str from its default ("scale"); it takes a float.
    return SVC(gamma=0.001, C=10.0).fit(*load_pixels_and_labels())  # pyright: ignore[reportArgumentType]


def classify_digits(images: np.ndarray) -> np.ndarray:
    """Predicted class of each image in [-1, 1], [N, 8, 8, 1]."""
    images = np.asarray(images)
    if images.shape[1:] != (8, 8, 1):
        raise ValueError(f"classify_digits: images must be [N, 8, 8, 1], got {images.shape}")
    return _classifier().predict(to_source_range(images))


def _digits_class_accuracy(images: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of samples the independent classifier labels as the class they were asked for."""
    labels = np.asarray(labels)
    if len(images) != len(labels):
        raise ValueError(f"digits_class_accuracy: {len(images)} images but {len(labels)} labels")
    return float(np.mean(classify_digits(images) == labels))


digits_class_accuracy = Metric(_digits_class_accuracy, goal="max")  # higher is better (dew.sweep)
registry.metrics.register("digits_class_accuracy", digits_class_accuracy)
