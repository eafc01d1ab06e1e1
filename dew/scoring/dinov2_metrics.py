"""FD_DINOv2 (Fréchet distance in DINOv2 ViT-L/14 features) as a streaming scorer and a metric.

``DINOv2Scorer`` has the interface of ``InceptionScorer`` (``features``, ``statistics``, both
taking NHWC batches in ``value_range``), so a command can run both scorers over the same
batches: it holds the converted ViT-L/14 weights (``dinov2_weights``) and a jitted
``dinov2.features`` (edm2's preprocessing, then the CLS features).

The registered metric ``fd_dinov2`` (for ``config.preview.metrics``) scores generated images in
[−1, 1] against reference statistics named by ``$DEW_FD_DINOV2_REFERENCE`` (an ``.npz`` with
``mu`` [1024] and ``sigma`` [1024, 1024], the layout of FID's, written by
``DINOv2Scorer(...).statistics(real batches).save(path)``). It loads the weights and the
reference on first use and raises, saying what to set, when either is missing; the weights'
source digest is not published, so it needs ``$DEW_DINOV2_ALLOW_UNPINNED=1`` until one is
pinned (see ``dinov2_weights``).

edm2 scores uint8 images; dew's generated images are floats mapped linearly to [0, 255] without
rounding, so FD_DINOv2 of the same samples saved as 8-bit files differs by their quantisation.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from dew import registry
from dew.scoring import distances
from dew.scoring.statistics import FeatureStatistics, load_statistics

REFERENCE_ENV = "DEW_FD_DINOV2_REFERENCE"


class DINOv2Scorer:
    """FD_DINOv2 features for NHWC image batches in ``value_range``, streamed into statistics."""

    def __init__(
        self,
        params: Any = None,
        weights_path: str | None = None,
        *,
        allow_unpinned: bool = False,
        config=None,
    ):
        import jax

        from dew.scoring import dinov2
        from dew.scoring.dinov2_weights import load_weights

        self.config = config or dinov2.VIT_L14
        if params is None:
            params = load_weights(weights_path, allow_unpinned=allow_unpinned, config=self.config)
        self.params = params
        self._features = jax.jit(dinov2.features, static_argnames=("value_range", "config"))

    def features(self, images: Any, value_range: tuple[float, float] = (-1.0, 1.0)) -> Any:
        """[N, embed_dim] features (a jax.Array)."""
        return self._features(
            self.params, images, value_range=tuple(map(float, value_range)), config=self.config
        )

    def statistics(
        self, batches: Iterable[Any], value_range: tuple[float, float] = (-1.0, 1.0), keep_features: int = 0
    ) -> FeatureStatistics:
        stats = FeatureStatistics(keep_features=keep_features)
        for images in batches:
            stats.update(self.features(images, value_range))
        return stats


def _allow_unpinned() -> bool:
    from dew.scoring.dinov2_weights import ALLOW_UNPINNED_ENV

    return os.environ.get(ALLOW_UNPINNED_ENV, "") not in ("", "0")


@functools.cache
def _scorer() -> DINOv2Scorer:
    return DINOv2Scorer(allow_unpinned=_allow_unpinned())


@functools.cache
def _reference() -> dict[str, np.ndarray]:
    path = os.environ.get(REFERENCE_ENV)
    if not path:
        raise FileNotFoundError(
            f"the fd_dinov2 metric needs reference statistics: set {REFERENCE_ENV} to an .npz with mu "
            "[1024] and sigma [1024, 1024] of real images' DINOv2 features"
        )
    return load_statistics(path)


def _batches(images: np.ndarray, size: int = 64):
    for i in range(0, len(images), size):
        yield images[i : i + size]


def fd_dinov2(images: np.ndarray, labels: np.ndarray | None = None) -> float:
    """FD_DINOv2 of images in [−1, 1] (NHWC) to ``$DEW_FD_DINOV2_REFERENCE``."""
    ref = _reference()
    stats = _scorer().statistics(_batches(np.asarray(images)))
    return distances.frechet_distance(stats.mu, stats.sigma, ref["mu"], ref["sigma"])


def check_ready() -> None:
    """Raise now, saying what to set, when a run asking for fd_dinov2 could not score its first
    preview: no reference statistics, or no (usable) DINOv2 weights."""
    from dew.scoring.dinov2_weights import read_arrays

    _reference()
    read_arrays(allow_unpinned=_allow_unpinned())


fd_dinov2.check_ready = check_ready  # type: ignore[attr-defined]
registry.metrics.register("fd_dinov2", fd_dinov2)

__all__ = ["REFERENCE_ENV", "DINOv2Scorer", "fd_dinov2"]
