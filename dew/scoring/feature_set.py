"""The one interface every image-set metric reads: ``FeatureSet``, what a set of images gives in
each feature space, and the metrics as functions of a samples' and a reference's ``FeatureSet``.

Feature spaces (``SPACES``): ``pool`` (the FID Inception's pool_3 [2048]), ``spatial`` (its
``mixed_6/conv[..., :7]`` flattened [2023], sFID's) and ``dinov2`` (DINOv2's CLS features,
FD_DINOv2's). A set holds per space its float64 mean and covariance (``moments``) and, where a
metric needs every row, a function giving the rows (``rows``: KID, precision and recall read the
pool rows) and the classifier's softmax rows (``probabilities``: the Inception Score). Rows are
functions so a set whose rows live in files (a protocol draw's chunks) reads them only when a
metric asks.

Whoever made the features builds the set: ``FeatureSet.of`` from ``python -m dew.fid``'s
statistics by metric name (``FeatureStatistics`` or a statistics file's ``mu``/``sigma``/
``features``), ``FeatureSet.of_adm`` from ADM's ``mu``/``sigma``/``mu_s``/``sigma_s``/``pool``
layout (an image set, a reference batch, a protocol draw's tally). ``score_sets`` (every metric of
two sets, FID, sFID, FD_DINOv2, KID, IS, precision and recall) reads nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

SPACES = ("pool", "spatial", "dinov2")
FRECHET_SPACE = {"fid": "pool", "sfid": "spatial", "fd_dinov2": "dinov2"}  # metric -> its space
LABELS = {"fid": "FID", "sfid": "sFID", "fd_dinov2": "FD_DINOv2"}

Rows = Callable[[], np.ndarray]


@dataclasses.dataclass(frozen=True)
class FeatureSet:
    """One image set's features: ``moments[space]`` = (mu [D], sigma [D, D]); ``rows[space]()``
    the feature rows [N, D] where kept; ``probabilities()`` softmax rows [N, classes] where kept."""

    moments: Mapping[str, tuple[np.ndarray, np.ndarray]]
    rows: Mapping[str, Rows] = dataclasses.field(default_factory=dict)
    probabilities: Rows | None = None

    @classmethod
    def of(cls, stats: Mapping[str, Any]) -> FeatureSet:
        """From statistics by metric name (``fid``, ``fd_dinov2``): a ``FeatureStatistics`` or a
        statistics file's dict (``mu``, ``sigma``, optional ``features``, the rows kept)."""
        moments: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        rows: dict[str, Rows] = {}
        for name, s in stats.items():
            space = FRECHET_SPACE[name]
            if isinstance(s, Mapping):
                moments[space] = (s["mu"], s["sigma"])
                if "features" in s:
                    rows[space] = lambda kept=s["features"]: np.asarray(kept)
            else:  # FeatureStatistics: its kept rows read (and refused when none) only when asked
                moments[space] = (s.mu, s.sigma)
                rows[space] = lambda s=s: s.features
        return cls(moments, rows)

    @classmethod
    def of_adm(
        cls, stats: Mapping[str, Any], pool: Rows | None = None, probabilities: Rows | None = None
    ) -> FeatureSet:
        """From ADM's layout: ``mu``, ``sigma`` (pool), ``mu_s``, ``sigma_s`` (spatial) where
        present, the pool rows (``pool``, else the layout's own ``pool`` rows where it holds them)
        and softmax rows where given."""
        if pool is None and "pool" in stats:
            pool = lambda: stats["pool"]  # noqa: E731  (a stored reference batch's rows)
        moments: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if "mu" in stats:
            moments["pool"] = (stats["mu"], stats["sigma"])
        if "mu_s" in stats:
            moments["spatial"] = (stats["mu_s"], stats["sigma_s"])
        return cls(moments, {} if pool is None else {"pool": pool}, probabilities)


def frechet(metric: str, samples: FeatureSet, reference: FeatureSet) -> float:
    """The Fréchet distance of ``metric`` (``fid``, ``sfid``, ``fd_dinov2``) between the sets'
    moments in its space; a reference of another feature width is a ``ValueError`` naming it."""
    from dew.scoring.distances import frechet_distance

    space = FRECHET_SPACE[metric]
    (mu, sigma), (ref_mu, ref_sigma) = samples.moments[space], reference.moments[space]
    if np.shape(ref_mu) != np.shape(mu):
        raise ValueError(
            f"{LABELS[metric]} reference statistics have {np.shape(ref_mu)[-1]} features, the "
            f"{LABELS[metric]} network gives {np.shape(mu)[-1]}: they come from another network"
        )
    return float(frechet_distance(mu, sigma, ref_mu, ref_sigma))


def score_sets(
    metrics: Sequence[str], samples: FeatureSet, reference: FeatureSet, arithmetic: str = "float16"
) -> dict[str, Any]:
    """Every image-set metric ``python -m dew.fid`` reports, of ``samples`` against ``reference``,
    in ``metrics``' order: ``fid``, ``sfid``, ``fd_dinov2`` (``frechet``); ``kid``, a (mean, std)
    pair over the pool rows (``distances.kernel_distance``); ``is``, ADM's Inception Score of the
    samples' softmax rows (``adm_evaluator.inception_score``); ``precision``, ``recall``, ADM's
    improved precision and recall between the pool rows (``adm_evaluator.precision_recall``,
    computed once for both, its distances in ``arithmetic``: ``float16``, the evaluator's graph as
    ADM's numbers were computed, or ``float32``, its float32 branch, the same on every platform;
    ``adm_evaluator``'s module docstring says what each reproduces). Rows are read only when a
    metric needs them; a reference of another feature width is a ``ValueError`` naming it."""
    from dew.scoring import adm_evaluator, distances

    out: dict[str, Any] = {}
    pr = None
    for name in metrics:
        if name in FRECHET_SPACE:
            out[name] = frechet(name, samples, reference)
        elif name == "kid":
            out[name] = distances.kernel_distance(samples.rows["pool"](), reference.rows["pool"]())
        elif name == "is":
            assert samples.probabilities is not None, "the Inception Score needs the samples' softmax rows"
            out[name] = adm_evaluator.inception_score(samples.probabilities())
        else:
            if pr is None:
                pr = adm_evaluator.precision_recall(
                    reference.rows["pool"](), samples.rows["pool"](), arithmetic=arithmetic
                )
            out[name] = pr[0] if name == "precision" else pr[1]
    return out


__all__ = ["FRECHET_SPACE", "SPACES", "FeatureSet", "frechet", "score_sets"]
