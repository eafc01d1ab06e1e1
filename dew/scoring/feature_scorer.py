"""What every Fréchet-distance scorer over a feature network shares (FID, FD_DINOv2).

A ``FeatureScorer`` maps NHWC image batches in ``value_range`` to [N, D] features (its
``features``, the one method a network's scorer writes) and streams any number of batches into
``FeatureStatistics`` (float64, one pass); ``statistics_over`` streams the same batches into
several scorers' statistics at once (each batch drawn once for all of them). A registered metric
scores generated images against reference statistics an environment variable names
(``reference_from_env``), fed to the scorer in fixed-size batches (``frechet_to``).

Given a ``batch_size``, ``statistics_over`` regroups the stream into batches of exactly that
many rows (``fixed_batches``: the last padded, its padding's features dropped), so a scorer
compiles one program however its source cuts the images: a run's draws, a folder's last
partial batch. On an accelerator each further batch shape of the FID Inception is a compile of
about a minute.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from dew.scoring import distances
from dew.scoring.statistics import FeatureStatistics, load_statistics


class FeatureScorer(abc.ABC):
    """A feature network's features of NHWC batches, streamed into ``FeatureStatistics``."""

    @abc.abstractmethod
    def features(self, images: Any, value_range: tuple[float, float] = (-1.0, 1.0)) -> Any:
        """[N, D] features of ``images`` (NHWC, values in ``value_range``), a jax.Array."""

    def statistics(
        self, batches: Iterable[Any], value_range: tuple[float, float] = (-1.0, 1.0), keep_features: int = 0
    ) -> FeatureStatistics:
        """The statistics of every batch's features (the first ``keep_features`` rows kept)."""
        stats = FeatureStatistics(keep_features=keep_features)
        for images in batches:
            stats.update(self.features(images, value_range))
        return stats


def fixed_batches(batches: Iterable[Any], size: int) -> Iterator[tuple[np.ndarray, int]]:
    """The rows of ``batches`` (host arrays [n, ...], one row shape) in order, regrouped into
    arrays of exactly ``size`` rows, each with its count of real rows: every array is full but
    the last, which is padded by repeating its last row. A stream of fewer than ``size`` rows in
    all is one array of its own rows, not padded up to ``size`` (still one shape)."""
    if size < 1:
        raise ValueError(f"fixed_batches: size must be >= 1, got {size}")
    pending: list[np.ndarray] = []
    held = 0
    full = False  # a full array was given: the last one is padded to its shape
    for batch in batches:
        rows = np.asarray(batch)
        if len(rows):
            pending.append(rows)
            held += len(rows)
        while held >= size:
            rows = np.concatenate(pending) if len(pending) > 1 else pending[0]
            yield rows[:size], size
            full = True
            pending, held = ([rows[size:]] if len(rows) > size else []), len(rows) - size
    if held:
        rows = np.concatenate(pending) if len(pending) > 1 else pending[0]
        yield (np.concatenate([rows, np.repeat(rows[-1:], size - held, axis=0)]) if full else rows), held


def statistics_over(
    scorers: Mapping[str, FeatureScorer],
    batches: Iterable[Any],
    value_range: tuple[float, float],
    keep_features: Mapping[str, int] | None = None,
    *,
    batch_size: int | None = None,
) -> dict[str, FeatureStatistics]:
    """One pass over ``batches``: every batch goes to every scorer's ``features`` and into that
    scorer's ``FeatureStatistics`` (``keep_features[name]`` rows kept). With ``batch_size`` the
    batches are first regrouped into that many rows (``fixed_batches``; the padding's features
    dropped on the host), so each scorer sees one batch shape. Returns the statistics by metric
    name, in ``scorers``' order."""
    keep = keep_features or {}
    stats = {name: FeatureStatistics(keep_features=keep.get(name, 0)) for name in scorers}
    if batch_size is None:
        grouped: Iterable[tuple[Any, int]] = ((images, len(images)) for images in batches)
    else:
        grouped = fixed_batches(batches, batch_size)
    for images, n in grouped:
        for name, scorer in scorers.items():
            features = scorer.features(images, value_range)
            stats[name].update(features if n == len(images) else np.asarray(features)[:n])
    return stats


def reference_from_env(env_var: str, missing: str) -> dict[str, np.ndarray]:
    """The reference statistics at ``$env_var`` (``load_statistics``); ``FileNotFoundError``
    with the message ``missing`` (what to set) when the variable is unset or empty."""
    path = os.environ.get(env_var)
    if not path:
        raise FileNotFoundError(missing)
    return load_statistics(path)


def batches(images: np.ndarray, size: int) -> Iterator[np.ndarray]:
    """``images`` in consecutive slices of ``size`` (the last may be shorter)."""
    for i in range(0, len(images), size):
        yield images[i : i + size]


def frechet_to(
    scorer: FeatureScorer, images: Any, reference: Mapping[str, np.ndarray], batch_size: int
) -> float:
    """The Fréchet distance of ``images``' features (scored ``batch_size`` at a time, the last
    batch padded: one compiled program, ``fixed_batches``; values in [−1, 1]) to the reference's
    ``mu`` and ``sigma``."""
    stats = statistics_over({"": scorer}, [np.asarray(images)], (-1.0, 1.0), batch_size=batch_size)[""]
    return distances.frechet_distance(stats.mu, stats.sigma, reference["mu"], reference["sigma"])


__all__ = [
    "FeatureScorer",
    "batches",
    "fixed_batches",
    "frechet_to",
    "reference_from_env",
    "statistics_over",
]
