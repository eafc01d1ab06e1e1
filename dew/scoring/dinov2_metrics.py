"""FD_DINOv2 (Fréchet distance in DINOv2 ViT-L/14 features) as a streaming scorer and a metric.

``DINOv2Scorer`` has the interface of ``InceptionScorer`` (``features``, ``statistics``, both
taking NHWC batches in ``value_range``), so a command can run both scorers over the same
batches: it holds the converted ViT-L/14 weights (``dinov2_weights``) and a jitted
``dinov2.features`` (edm2's preprocessing, then the CLS features).

The registered metric ``fd_dinov2`` (for ``config.preview.metrics``) scores generated images in
[−1, 1] against reference statistics named by ``$DEW_FD_DINOV2_REFERENCE`` (an ``.npz`` with
``mu`` [1024] and ``sigma`` [1024, 1024], the layout of FID's, written by
``DINOv2Scorer(params).statistics(real batches).save(path)``). It loads the weights and the
reference on first use and raises, saying what to set, when either is missing; the weights'
source digest is not published, so it needs ``$DEW_DINOV2_ALLOW_UNPINNED=1`` until one is
pinned (see ``dinov2_weights``).

edm2 scores uint8 images; dew's generated images are floats mapped linearly to [0, 255] without
rounding, so FD_DINOv2 of the same samples saved as 8-bit files differs by their quantisation.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from dew import registry
from dew.registry import Metric
from dew.scoring.feature_scorer import FeatureScorer, frechet_to, reference_from_env

REFERENCE_ENV = "DEW_FD_DINOV2_REFERENCE"


class DINOv2Scorer(FeatureScorer):
    """FD_DINOv2 features for NHWC image batches in ``value_range``, streamed into statistics."""

    def __init__(
        self,
        params: Any = None,
        *,
        config=None,
        weights_path: str | None = None,
        allow_unpinned: bool = False,
    ):
        """``params``: the ViT's haiku params (``dinov2_weights.load_weights``, or
        ``dinov2.params_from_torch_names`` of the converted arrays) of ``config`` (default
        ViT-L/14). Without ``params``, as ``InceptionScorer`` does, the converted weights at
        ``weights_path`` (default: ``dinov2_weights``' default path) are read
        (``dinov2_weights.read_arrays``, ``allow_unpinned`` as there: ``FileNotFoundError`` /
        ``ValueError`` in one line), their ``config`` (default: read from the arrays' shapes,
        ``dinov2.config_from_torch_names``)."""
        import jax

        from dew.scoring import dinov2

        if params is None:
            from dew.scoring.dinov2_weights import read_arrays

            arrays = read_arrays(weights_path, allow_unpinned=allow_unpinned)
            config = config or dinov2.config_from_torch_names(arrays)
            params = dinov2.params_from_torch_names(arrays, config)
        self.config = config or dinov2.VIT_L14
        self.params = params
        self._features = jax.jit(dinov2.features, static_argnames=("value_range", "config"))

    def features(self, images: Any, value_range: tuple[float, float] = (-1.0, 1.0)) -> Any:
        """[N, embed_dim] features (a jax.Array)."""
        return self._features(
            self.params, images, value_range=tuple(map(float, value_range)), config=self.config
        )


def _allow_unpinned() -> bool:
    from dew.scoring.dinov2_weights import ALLOW_UNPINNED_ENV

    return os.environ.get(ALLOW_UNPINNED_ENV, "") not in ("", "0")


@functools.cache
def _scorer() -> DINOv2Scorer:
    from dew.scoring.dinov2_weights import load_weights

    return DINOv2Scorer(load_weights(allow_unpinned=_allow_unpinned()))


@functools.cache
def _reference() -> dict[str, np.ndarray]:
    return reference_from_env(
        REFERENCE_ENV,
        f"the fd_dinov2 metric needs reference statistics: set {REFERENCE_ENV} to an .npz with mu "
        "[1024] and sigma [1024, 1024] of real images' DINOv2 features",
    )


_BATCH_SIZE = 64  # images per call of the ViT when scoring a preview


def _fd_dinov2(images: np.ndarray, labels: np.ndarray | None = None) -> float:
    """FD_DINOv2 of images in [−1, 1] (NHWC) to ``$DEW_FD_DINOV2_REFERENCE``."""
    ref = _reference()
    return frechet_to(_scorer(), images, ref, _BATCH_SIZE)


def check_ready() -> None:
    """Raise now, saying what to set, when a run asking for fd_dinov2 could not score its first
    preview: no reference statistics, or no (usable) DINOv2 weights."""
    from dew.scoring.dinov2_weights import read_arrays

    _reference()
    read_arrays(allow_unpinned=_allow_unpinned())


fd_dinov2 = Metric(_fd_dinov2, check_ready)
registry.metrics.register("fd_dinov2", fd_dinov2)

__all__ = ["REFERENCE_ENV", "DINOv2Scorer", "fd_dinov2"]
