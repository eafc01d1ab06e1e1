"""FID and KID in the standard Inception feature space, as streaming scorers and as metrics.

``InceptionScorer`` holds the converted FID Inception weights (``convert_inception``) and a
jitted feature function; ``statistics(batches)`` streams any number of image batches through
it into ``FeatureStatistics`` (float64, one pass; batches may be sharded jax.Arrays).

The registered metrics ``fid`` and ``kid`` (for ``config.preview.metrics``) score generated images
against reference statistics named by ``$DEW_FID_REFERENCE`` (an ``.npz`` with ``mu``, ``sigma``
and, for KID, ``features``; ``python -m dew.fid --images=<real images> --save_stats=...`` writes
one). They load the weights and the reference on first use and raise, saying what to set, when
either is missing.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from dew import registry
from dew.registry import Metric
from dew.scoring import distances
from dew.scoring.feature_scorer import FeatureScorer, frechet_to, reference_from_env, statistics_over

REFERENCE_ENV = "DEW_FID_REFERENCE"


class InceptionScorer(FeatureScorer):
    """FID Inception features for NHWC image batches in ``value_range``, streamed into statistics."""

    def __init__(self, params: Any = None, weights_path: str | None = None, *, pinned: bool = True):
        import jax

        from dew.scoring import inception
        from dew.scoring.convert_inception import load_weights

        self.params = params if params is not None else load_weights(weights_path, pinned=pinned)
        self._features = jax.jit(inception.features, static_argnames=("value_range", "resize"))

    def features(self, images: Any, value_range: tuple[float, float] = (-1.0, 1.0)) -> Any:
        """[N, 2048] features (a jax.Array, sharded like ``images``)."""
        return self._features(self.params, images, value_range=value_range)


@functools.cache
def _scorer() -> InceptionScorer:
    return InceptionScorer()


@functools.cache
def _reference() -> dict[str, np.ndarray]:
    return reference_from_env(
        REFERENCE_ENV,
        f"the fid/kid metrics need reference statistics: set {REFERENCE_ENV} to an .npz with mu, "
        "sigma (and features for kid), e.g. from `python -m dew.fid --images=<real images> "
        "--save_stats=ref.npz`",
    )


def _kid_reference() -> dict[str, np.ndarray]:
    """The reference statistics, which must hold the features KID compares against."""
    ref = _reference()
    if "features" not in ref:
        raise ValueError(
            f"{os.environ.get(REFERENCE_ENV)} holds no 'features' for KID; write it with "
            "`python -m dew.fid --images=... --save_stats=... --keep_features=N`"
        )
    return ref


_BATCH_SIZE = 100  # images per call of the Inception when scoring a preview (the last padded)


def _inception_fid(images: np.ndarray, labels: np.ndarray | None = None) -> float:
    """FID of images in [−1, 1] (NHWC) to ``$DEW_FID_REFERENCE``."""
    ref = _reference()
    return frechet_to(_scorer(), images, ref, _BATCH_SIZE)


def _inception_kid(images: np.ndarray, labels: np.ndarray | None = None) -> float:
    """KID (mean over subsets) of images in [−1, 1] (NHWC) to the features in ``$DEW_FID_REFERENCE``."""
    ref = _kid_reference()
    images = np.asarray(images)
    keep = {"": len(images)}
    stats = statistics_over({"": _scorer()}, [images], (-1.0, 1.0), keep, batch_size=_BATCH_SIZE)[""]
    return distances.kernel_distance(stats.features, ref["features"])[0]


def check_ready(kid: bool = False) -> None:
    """Raise now, saying what to set, when a run asking for fid/kid could not score its first
    preview: no reference statistics (or no KID features in them), or no Inception weights."""
    from dew.scoring.convert_inception import weights_file

    _kid_reference() if kid else _reference()
    weights_file()


inception_fid = Metric(_inception_fid, check_ready)
registry.metrics.register("fid", inception_fid)
inception_kid = Metric(_inception_kid, functools.partial(check_ready, kid=True))
registry.metrics.register("kid", inception_kid)

__all__ = ["REFERENCE_ENV", "InceptionScorer", "inception_fid", "inception_kid"]
