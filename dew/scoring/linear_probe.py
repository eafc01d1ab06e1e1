"""A linear probe: how linearly separable by label a set of representations is.

The records of a ``Representations`` are split by a fixed rule: odd rows fit the probe, even
rows are held out. The probe is multinomial logistic regression (scikit-learn
``LogisticRegression``, L2, C = 1, lbfgs, up to 2,000 iterations) on the features standardised
with the fitting rows' mean and standard deviation. The score is the held-out accuracy. The same
probe on the records' raw inputs (e.g. pixels) is the baseline a representation has to beat.
"""

from __future__ import annotations

import warnings

import numpy as np

from dew import registry
from dew.artifacts import Representations


def probe_accuracy(features: np.ndarray, labels: np.ndarray) -> float:
    """Held-out accuracy of the probe fitted on the odd rows and scored on the even rows."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(features, np.float64).reshape(len(features), -1)
    y = np.asarray(labels)
    fit, held = np.arange(len(y)) % 2 == 1, np.arange(len(y)) % 2 == 0
    if len(np.unique(y[fit])) < 2:
        raise ValueError(f"linear_probe: the fitting rows hold {len(np.unique(y[fit]))} label(s); need >= 2")
    mean, std = x[fit].mean(0), x[fit].std(0) + 1e-8
    x = (x - mean) / std
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe = LogisticRegression(C=1.0, max_iter=2000).fit(x[fit], y[fit])
    return float(np.mean(probe.predict(x[held]) == y[held]))


def linear_probe(representations: Representations) -> float:
    """The probe's held-out accuracy on ``representations`` (see the module docstring)."""
    if not isinstance(representations, Representations):
        raise TypeError(f"linear_probe scores Representations, got {type(representations).__name__}")
    return probe_accuracy(representations.features, representations.labels)


registry.metrics.register("linear_probe", linear_probe)
