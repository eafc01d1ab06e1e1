"""Streaming feature statistics: mean and covariance in one pass, float64, from any batches.

``FeatureStatistics`` takes feature batches [n, D] one at a time: NumPy arrays, or jax.Arrays
of any sharding (batch sharded over a mesh, across processes too). Each batch is reduced to its
count, mean and centred scatter Σ (x − x̄)(x − x̄)ᵀ where it lives (for a jax.Array, by one jitted
reduction whose result is replicated, so only D + D² numbers leave the devices), and batches are
merged on the host in float64 with the pairwise update of Chan, Golub & LeVeque (1979):

    n = n_a + n_b,  δ = x̄_b − x̄_a,  x̄ = x̄_a + δ n_b / n,  M = M_a + M_b + δ δᵀ n_a n_b / n.

Centring each batch before its outer product keeps large feature means from cancelling the
covariance away (the naive Σ xxᵀ/n − x̄x̄ᵀ loses it in float32). The covariance is the unbiased
M / (n − 1), as ``np.cov`` gives and FID tools store.

Reference statistics are ``.npz`` files with ``mu`` [D] and ``sigma`` [D, D] (the layout
pytorch-fid and clean-fid read and write), optionally ``features`` [N, D] for KID; read with
``allow_pickle=False``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from dew.npz import Member, NotAnNpzError, read_npz


@functools.cache
def _moments_fn(sharding: Any):
    import jax
    import jax.numpy as jnp

    def moments(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = x.astype(jnp.float32)
        mean = jnp.mean(x, axis=0)
        centred = x - mean
        return mean, centred.T @ centred

    return jax.jit(moments, out_shardings=sharding)


def _replicated_sharding(x: Any) -> Any:
    import jax

    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return None


def _host(x: Any) -> np.ndarray:
    """A replicated jax.Array (or any array) as NumPy, also when it spans several processes."""
    if hasattr(x, "is_fully_addressable") and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)


def _gather(x: Any) -> np.ndarray:
    """All rows of a (possibly multi-process, sharded) array on this host."""
    if hasattr(x, "is_fully_addressable") and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


class FeatureStatistics:
    """Running count, mean and covariance of feature vectors (one pass, float64).

    ``update(features)`` accepts [n, D] NumPy arrays (reduced in float64 on the host) or
    jax.Arrays of any sharding (reduced on the devices in float32 per batch, merged in float64).
    ``keep_features`` > 0 also keeps up to that many rows on the host (for KID). ``mu`` and
    ``sigma`` are the mean and the unbiased covariance; both need at least two rows.
    """

    def __init__(self, keep_features: int = 0):
        if not isinstance(keep_features, int) or keep_features < 0:
            raise ValueError(f"FeatureStatistics: keep_features must be an int >= 0, got {keep_features!r}")
        self.count = 0
        self._mean: np.ndarray | None = None
        self._scatter: np.ndarray | None = None
        self.keep_features = keep_features
        self._kept: list[np.ndarray] = []
        self._kept_rows = 0

    @property
    def dim(self) -> int | None:
        return None if self._mean is None else int(self._mean.shape[0])

    def update(self, features: Any) -> FeatureStatistics:
        """Add a batch of feature rows [n, D]; returns ``self``."""
        shape = tuple(getattr(features, "shape", np.shape(features)))
        if len(shape) != 2 or shape[0] < 1:
            raise ValueError(f"FeatureStatistics.update: features must be [n >= 1, D], got shape {shape}")
        if self.dim is not None and shape[1] != self.dim:
            raise ValueError(
                f"FeatureStatistics.update: features have D={shape[1]}, earlier batches had D={self.dim}"
            )
        n = int(shape[0])
        if isinstance(features, np.ndarray):
            x = features.astype(np.float64, copy=False)
            mean = x.mean(axis=0)
            centred = x - mean
            scatter = centred.T @ centred
        else:
            mean, scatter = _moments_fn(_replicated_sharding(features))(features)
            mean, scatter = _host(mean).astype(np.float64), _host(scatter).astype(np.float64)
        self._merge(n, mean, scatter)
        if self._kept_rows < self.keep_features:
            rows = _gather(features)[: self.keep_features - self._kept_rows].astype(np.float32)
            self._kept.append(rows)
            self._kept_rows += len(rows)
        return self

    def _merge(self, n: int, mean: np.ndarray, scatter: np.ndarray) -> None:
        if self._mean is None:
            self.count, self._mean, self._scatter = n, mean.copy(), scatter.copy()
            return
        total = self.count + n
        delta = mean - self._mean
        self._mean = self._mean + delta * (n / total)
        self._scatter = self._scatter + scatter + np.outer(delta, delta) * (self.count * n / total)
        self.count = total

    @property
    def mu(self) -> np.ndarray:
        """The mean [D] (float64)."""
        self._need(1)
        assert self._mean is not None  # _need(1): at least one row added
        return self._mean.copy()

    @property
    def sigma(self) -> np.ndarray:
        """The unbiased covariance [D, D] (float64, divided by n − 1)."""
        self._need(2)
        assert self._scatter is not None  # _need(2): rows added
        s = self._scatter / (self.count - 1)
        return 0.5 * (s + s.T)

    @property
    def features(self) -> np.ndarray:
        """The kept rows [min(count, keep_features), D] (float32)."""
        if not self._kept:
            raise ValueError("FeatureStatistics.features: no rows kept (construct with keep_features > 0)")
        return np.concatenate(self._kept)

    def _need(self, rows: int) -> None:
        if self.count < rows:
            raise ValueError(f"FeatureStatistics: need at least {rows} feature rows, have {self.count}")

    def save(self, path: str | os.PathLike) -> None:
        """Write ``mu``, ``sigma`` (and ``features`` when kept) as an ``.npz``."""
        save_statistics(path, self.mu, self.sigma, self.features if self._kept else None)


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mu, sigma) of one [N, D] array, through the same code as streamed batches."""
    stats = FeatureStatistics().update(np.asarray(features))
    return stats.mu, stats.sigma


def save_statistics(
    path: str | os.PathLike, mu: np.ndarray, sigma: np.ndarray, features: np.ndarray | None = None
) -> None:
    """Write reference statistics as ``.npz`` with ``mu`` [D], ``sigma`` [D, D] (float64) and,
    if given, ``features`` [N, D]: the layout other FID tools read."""
    mu, sigma = np.asarray(mu, np.float64), np.asarray(sigma, np.float64)
    _check_stats(mu, sigma, str(path))
    arrays = {"mu": mu, "sigma": sigma}
    if features is not None:
        arrays["features"] = np.asarray(features)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, **arrays, allow_pickle=False)


def load_statistics(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read an ``.npz`` of reference statistics: ``{"mu", "sigma"}`` and ``"features"`` if stored.

    Raises naming the file when it is missing, is not such an ``.npz`` (``dew.npz.read_npz``:
    sizes checked before anything is allocated), lacks ``mu``/``sigma`` of matching shapes, or
    holds values that are not finite or records (``num_images``) fewer than 2 images.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"reference statistics {str(path)!r} not found: expected an .npz with 'mu' [D] and "
            "'sigma' [D, D] (write one with `python -m dew.fid --save_stats=...` on a folder of real images)"
        )
    schema = {
        "mu": Member("f", ("D",)),
        "sigma": Member("f", ("D", "D")),
        "features": Member("f", (None, "D"), required=False),
        "num_images": Member("iu", (), required=False),  # dew's references record it
    }
    try:  # each member's size checked before it is read; other members are not read
        data = read_npz(path, "reference statistics", schema, others="ignore")
    except NotAnNpzError as e:
        raise ValueError(str(e)) from None
    out = {k: np.asarray(v) for k, v in data.items() if k != "num_images"}
    if "num_images" in data and int(np.asarray(data["num_images"])) < 2:
        raise ValueError(
            f"reference statistics {str(path)!r} record {int(np.asarray(data['num_images']))} images; "
            "a covariance needs at least 2"
        )
    out["mu"], out["sigma"] = out["mu"].astype(np.float64), out["sigma"].astype(np.float64)
    for key, value in out.items():
        if not np.isfinite(value).all():  # the Fréchet distance of NaN statistics is no number
            raise ValueError(f"reference statistics {str(path)!r}: {key} holds values that are not finite")
    return out


def _check_stats(mu: np.ndarray, sigma: np.ndarray, where: str) -> None:
    if mu.ndim != 1 or sigma.shape != (mu.shape[0], mu.shape[0]):
        raise ValueError(
            f"{where}: expected mu [D] and sigma [D, D], got mu {mu.shape} and sigma {sigma.shape}"
        )


__all__ = ["FeatureStatistics", "feature_statistics", "load_statistics", "save_statistics"]
