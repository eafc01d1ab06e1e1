"""ADM's evaluation suite (openai/guided-diffusion ``evaluations/evaluator.py``) from features:
FID, sFID, Inception Score, precision and recall, by that file's own rules.

The Inception outputs it reads (``dew.scoring.inception.adm_features`` and ``logits``): for each
image ``pool_3`` [2048] and ``mixed_6/conv[..., :7]`` flattened [2023], the images fed at their
own size to the 2015-12-05 graph (its TF1 resize to 299 and (x − 128)/128: ``handling="tf1"``).

* **FID / sFID**: the Fréchet distance between (μ, Σ) of the pool features / of the spatial
  features, μ = mean, Σ = ``np.cov`` (unbiased). dew streams both in float64
  (``FeatureStatistics``); the evaluator takes float32 means. The distance is
  ``dew.scoring.distances.frechet_distance`` (the evaluator's ``scipy.linalg.sqrtm`` formula,
  ‖μ₁ − μ₂‖² + Tr Σ₁ + Tr Σ₂ − 2 Tr (Σ₁Σ₂)^{1/2}, computed through symmetric eigenproblems).
* **Inception Score** (``inception_score``): softmax of the bias-free logits (the rows
  ``dew.scoring.adm_metrics.AdmScorer.probabilities`` gives), then over consecutive splits of
  ``split_size`` = 5000 rows (10 splits at 50,000 images; the last split shorter when the count
  is not a multiple), exp of the mean over the split of KL(p(y|x) ‖ p̄(y)), averaged over splits;
  computed with the evaluator's float32 NumPy steps.
* **Precision / recall** (``ManifoldEstimator``, Kynkäänniemi et al. 2019 as the evaluator
  adapts it): each set's manifold is the union of balls around its points with radius the
  distance to the k = 3rd nearest neighbour (the point itself at distance 0 counted first);
  precision is the fraction of samples inside the reference manifold, recall the fraction of
  reference points inside the samples'. Distances are squared Euclidean, ‖u‖² − 2uᵀv + ‖v‖²
  clamped at 0, computed **in float16** (inputs cast to float16, each step rounded to float16,
  as the evaluator's TF graph casts them) and taken in float32 only for a block of
  ``row_batch_size`` × ``col_batch_size`` (10,000 × 10,000) pairs where a float16 value is not
  finite; blocks, radii and comparisons follow the evaluator's loops. A point is in a ball when
  its distance is ≤ the radius.

  **Which platform's arithmetic** (``arithmetic``): ``"float16"`` (the default) is the
  evaluator's graph as written, emulated op by op: every float16 op's result is the float32
  accumulation of its float16 inputs rounded once to float16. That is a model of a GPU's
  float16 kernels (cuBLAS GEMMs and reductions accumulate in float32), where ADM's published
  numbers were computed, but it is *not* checked against a GPU, and no platform's float16 sums
  are reproduced bit for bit: against the evaluator on TF-CPU 51 % of distances are bit-equal
  (TF-CPU's float16 ``reduce_sum`` rounds in an order of its own), all within the derived
  float16 bound, and a few points per thousand land on the other side of a radius (on 2048-d
  features the distances concentrate and float16 resolves them to ~0.1 %): P/R 0.8333 / 0.8575
  against TF-CPU's 0.84 / 0.855 on the tests' 400 / 300 points. Such float16 P/R carry that
  platform uncertainty, on the evaluator's side as on dew's. ``"float32"`` computes every block
  in float32: the evaluator's own float32 branch (``_batch_pairwise_distances`` on the float32
  inputs), which it takes itself whenever float16 overflows; against that branch on TF-CPU dew
  gives the same precision and recall (tests: 0.83 / 0.8375 and 0.748 / 0.7607 on 1,500 / 1,500
  overlapping points, equal), distances agreeing to float32 matmul roundoff. Use it where P/R
  must be reproducible across platforms; it is not the published numbers' arithmetic.

Reference batches (``read_reference_batch``, ``write_reference_batch``) are ADM's ``.npz``
layout: ``arr_0`` uint8 images [N, H, W, 3] (what its evaluator embeds for precision and
recall), and ``mu``, ``sigma`` (pool statistics) and ``mu_s``, ``sigma_s`` (spatial
statistics). dew adds ``pool`` (the float32 pool features of ``arr_0``, so precision and recall
need no second pass through the network), ``resolution``, ``num_images`` and ``detector``;
the evaluator reads only its own keys.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dew.bounded_zip import ZIP_ERRORS, UnreadableFileError, read_exactly, reason
from dew.npz import Member, NotAnNpzError, NpyHeader, open_npy_member, read_npz

SPLIT_SIZE = 5000  # compute_inception_score's split_size
ROW_BATCH_SIZE = COL_BATCH_SIZE = 10_000  # ManifoldEstimator's defaults
NHOOD_SIZES = (3,)
POOL_DIM, SPATIAL_DIM = 2048, 17 * 17 * 7


class ReferenceBatchError(ValueError):
    """A reference batch dew cannot use (one line naming the file)."""


def inception_score(probabilities: np.ndarray, split_size: int = SPLIT_SIZE) -> float:
    """``Evaluator.compute_inception_score`` on softmax rows [N, classes]: per split of
    ``split_size`` rows, exp(mean_i Σ_y p_iy (log p_iy − log p̄_y)), averaged over splits."""
    preds = np.asarray(probabilities, np.float32)
    scores = []
    for i in range(0, len(preds), split_size):
        part = preds[i : i + split_size]
        kl = part * (np.log(part) - np.log(np.expand_dims(np.mean(part, 0), 0)))
        kl = np.mean(np.sum(kl, 1))
        scores.append(np.exp(kl))
    return float(np.mean(scores))


def _f16_distances(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """max(‖u‖² − 2uᵀv + ‖v‖², 0) on float16 inputs, each step rounded to float16 (sums and
    products accumulated in float32 first); float16 [len(u), len(v)]."""
    h, f = np.float16, np.float32
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the float32 path's cue
        u16, v16 = u.astype(h), v.astype(h)
        norm_u = np.square(u16.astype(f)).astype(h).astype(f).sum(1).astype(h)
        norm_v = np.square(v16.astype(f)).astype(h).astype(f).sum(1).astype(h)
        cross = (u16.astype(f) @ v16.astype(f).T).astype(h)
        twice = (h(2) * cross).astype(h)
        partial = (norm_u.astype(f)[:, None] - twice.astype(f)).astype(h)
        total = (partial.astype(f) + norm_v.astype(f)[None, :]).astype(h)
    return np.maximum(total, h(0))


def _f32_distances(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    u, v = u.astype(np.float32), v.astype(np.float32)
    norm_u, norm_v = np.sum(np.square(u), 1), np.sum(np.square(v), 1)
    return np.maximum(norm_u[:, None] - 2 * (u @ v.T) + norm_v[None, :], np.float32(0))


ARITHMETICS = ("float16", "float32")


def pairwise_distances(u: np.ndarray, v: np.ndarray, arithmetic: str = "float16") -> np.ndarray:
    """``DistanceBlock.pairwise_distances``: float32 [len(u), len(v)] squared distances, from
    float16 arithmetic when every value of the block is finite, else from float32;
    ``arithmetic="float32"``: from float32 always (module docstring)."""
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic={arithmetic!r} is unknown: expected one of {ARITHMETICS}")
    if arithmetic == "float32":
        return _f32_distances(u, v)
    d16 = _f16_distances(u, v)
    if np.all(np.isfinite(d16)):
        return d16.astype(np.float32)
    return _f32_distances(u, v)


class ManifoldEstimator:
    """The evaluator's ``ManifoldEstimator`` (k-NN radii, precision and recall) with its block
    sizes; ``distances`` computes one block (default ``pairwise_distances`` in ``arithmetic``)."""

    def __init__(
        self,
        row_batch_size: int = ROW_BATCH_SIZE,
        col_batch_size: int = COL_BATCH_SIZE,
        nhood_sizes: tuple[int, ...] = NHOOD_SIZES,
        distances=None,
        arithmetic: str = "float16",
    ):
        if arithmetic not in ARITHMETICS:
            raise ValueError(f"arithmetic={arithmetic!r} is unknown: expected one of {ARITHMETICS}")
        if distances is None:
            distances = functools.partial(pairwise_distances, arithmetic=arithmetic)
        self.row_batch_size, self.col_batch_size = row_batch_size, col_batch_size
        self.nhood_sizes, self.distances = tuple(nhood_sizes), distances

    def manifold_radii(self, features: np.ndarray) -> np.ndarray:
        """[N, len(nhood_sizes)] float32: each row's distance to its k-th neighbour (itself first)."""
        n = len(features)
        radii = np.zeros([n, len(self.nhood_sizes)], np.float32)
        seq = np.arange(max(self.nhood_sizes) + 1)
        batch = np.zeros([min(self.row_batch_size, n), n], np.float32)
        for begin1 in range(0, n, self.row_batch_size):
            end1 = min(begin1 + self.row_batch_size, n)
            rows = features[begin1:end1]
            for begin2 in range(0, n, self.col_batch_size):
                end2 = min(begin2 + self.col_batch_size, n)
                batch[0 : end1 - begin1, begin2:end2] = self.distances(rows, features[begin2:end2])
            part = np.partition(batch[0 : end1 - begin1, :], seq, axis=1)
            radii[begin1:end1, :] = part[:, list(self.nhood_sizes)]
        return radii

    def evaluate_pr(
        self, features_1: np.ndarray, radii_1: np.ndarray, features_2: np.ndarray, radii_2: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(fraction of set 2 inside set 1's manifold, fraction of set 1 inside set 2's), one value
        per neighbourhood size: with set 1 the reference, (precision, recall)."""
        status_1 = np.zeros([len(features_1), radii_2.shape[1]], bool)
        status_2 = np.zeros([len(features_2), radii_1.shape[1]], bool)
        for begin_1 in range(0, len(features_1), self.row_batch_size):
            end_1 = begin_1 + self.row_batch_size
            for begin_2 in range(0, len(features_2), self.col_batch_size):
                end_2 = begin_2 + self.col_batch_size
                d = self.distances(features_1[begin_1:end_1], features_2[begin_2:end_2])[..., None]
                status_1[begin_1:end_1] |= np.any(d <= radii_2[begin_2:end_2], axis=1)
                status_2[begin_2:end_2] |= np.any(d <= radii_1[begin_1:end_1][:, None], axis=0)
        return np.mean(status_2.astype(np.float64), axis=0), np.mean(status_1.astype(np.float64), axis=0)


def precision_recall(
    reference: np.ndarray,
    samples: np.ndarray,
    estimator: ManifoldEstimator | None = None,
    arithmetic: str = "float16",
):
    """``Evaluator.compute_prec_recall``: (precision, recall) of ``samples`` against
    ``reference`` pool features (k = 3); ``arithmetic`` (without ``estimator``): ``float16``, the
    evaluator's graph, or ``float32``, its float32 branch for every block (module docstring)."""
    estimator = estimator or ManifoldEstimator(arithmetic=arithmetic)
    reference, samples = np.asarray(reference, np.float32), np.asarray(samples, np.float32)
    for name, rows in (("reference", reference), ("sample", samples)):
        if not np.isfinite(rows).all():  # a NaN is in no ball: precision and recall 0, silently
            raise ValueError(f"precision_recall: the {name} features hold values that are not finite")
    radii_1 = estimator.manifold_radii(reference)
    radii_2 = estimator.manifold_radii(samples)
    precision, recall = estimator.evaluate_pr(reference, radii_1, samples, radii_2)
    return float(precision[0]), float(recall[0])


# ----------------------------------------------------------------------------- reference batches


def write_reference_batch(
    path: str,
    *,
    images: np.ndarray | None,
    pool: np.ndarray,
    stats: dict[str, np.ndarray],
    resolution: tuple[int, int],
    detector: str,
) -> None:
    """ADM's reference-batch ``.npz`` (``arr_0`` when ``images`` are given, ``mu``, ``sigma``,
    ``mu_s``, ``sigma_s``) plus dew's ``pool``, ``resolution``, ``num_images``, ``detector``;
    written atomically."""
    arrays: dict[str, np.ndarray | np.generic] = {
        k: np.asarray(stats[k], np.float64) for k in ("mu", "sigma", "mu_s", "sigma_s")
    }
    if images is not None:
        arrays["arr_0"] = np.asarray(images, np.uint8)
    arrays["pool"] = np.asarray(pool, np.float32)
    arrays["resolution"] = np.asarray(resolution, np.int64)
    arrays["num_images"] = np.int64(len(pool))
    arrays["detector"] = np.str_(detector)
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays, allow_pickle=False)
    os.replace(tmp, path)


STATISTICS = (("mu", "sigma", POOL_DIM), ("mu_s", "sigma_s", SPATIAL_DIM))
MIN_ROWS = 2  # a covariance needs two rows


def _batch_schema() -> dict[str, Member]:
    schema = {
        "arr_0": Member("u", ("N", "H", "W", 3), required=False),
        "pool": Member("f", ("N", POOL_DIM), required=False),
        "resolution": Member("iu", (2,), required=False),
        "num_images": Member("iu", (), required=False),
        "detector": Member("U", (), max_bytes=4 * 4096, required=False),
    }
    for mu, sigma, dim in STATISTICS:
        schema[mu], schema[sigma] = (
            Member("f", (dim,), required=False),
            Member("f", (dim, dim), required=False),
        )
    return schema


def read_reference_batch(path: str, flag: str = "--ref") -> dict[str, Any]:
    """An ADM reference batch: ``mu``, ``sigma``, ``mu_s``, ``sigma_s`` (float64) when stored,
    ``images`` (a lazy reader of ``arr_0``, uint8 [N, H, W, 3]) when stored, ``pool`` when dew
    stored it, ``resolution`` ([H, W]: recorded, else ``arr_0``'s), ``num_images``, ``detector``.

    Checked before anything is drawn or embedded (``dew.npz.read_npz``: every member's dtype and
    shape against the layout above, its size before it is allocated): ``ReferenceBatchError``,
    one line naming ``flag``, the file and the member, for a file that is not such a batch, a
    ``mu`` without its ``sigma`` (or the reverse), fewer than 2 images or pool rows, statistics or
    pool rows that are not finite, a ``num_images`` other than the rows stored, or a recorded
    ``resolution`` other than ``arr_0``'s."""
    if not os.path.isfile(path):
        raise ReferenceBatchError(f"{flag}={path!r} does not exist; expected an ADM reference batch .npz")
    try:
        data = read_npz(path, flag, _batch_schema(), others="ignore", lazy=frozenset({"arr_0"}))
    except NotAnNpzError as e:
        raise ReferenceBatchError(str(e)) from None
    where = f"{flag}={path!r}"
    out: dict[str, Any] = {}
    for mu, sigma, _ in STATISTICS:
        if (mu in data) != (sigma in data):
            have, lack = (mu, sigma) if mu in data else (sigma, mu)
            raise ReferenceBatchError(f"{where} holds {have} without {lack}; expected both or neither")
        for key in (mu, sigma) if mu in data else ():
            out[key] = np.asarray(data[key], np.float64)
            if not np.isfinite(out[key]).all():
                raise ReferenceBatchError(f"{where}: {key} holds values that are not finite")
    if "pool" in data:
        out["pool"] = np.asarray(data["pool"], np.float32)
        if not np.isfinite(out["pool"]).all():
            raise ReferenceBatchError(f"{where}: pool holds feature rows that are not finite")
    if "detector" in data:
        out["detector"] = str(np.asarray(data["detector"]))
    rows = None
    header = data.get("arr_0")
    if isinstance(header, NpyHeader):
        if header.dtype != np.uint8 or header.fortran:
            raise ReferenceBatchError(
                f"{where}: arr_0 is {header.dtype} {header.shape}"
                f"{' in Fortran order' if header.fortran else ''}; expected uint8 images [N, H, W, 3]"
            )
        out["images"] = ImageBatches(path, header.shape, flag)
        rows = header.shape[0]
    elif "pool" in out:
        rows = len(out["pool"])
    if "resolution" in data:
        recorded = tuple(int(v) for v in np.asarray(data["resolution"]))
        if "images" in out and recorded != tuple(out["images"].shape[1:3]):
            h, w = out["images"].shape[1:3]
            raise ReferenceBatchError(
                f"{where} records resolution {recorded[0]}x{recorded[1]}, its arr_0 holds {h}x{w} images; "
                "expected one resolution"
            )
        out["resolution"] = recorded
    elif "images" in out:
        out["resolution"] = tuple(out["images"].shape[1:3])
    if "num_images" in data:
        out["num_images"] = int(np.asarray(data["num_images"]))
        if rows is not None and out["num_images"] != rows:
            raise ReferenceBatchError(
                f"{where} records num_images={out['num_images']}, it stores {rows} rows"
            )
    if rows is not None:
        out["num_images"] = rows
        if rows < MIN_ROWS:
            raise ReferenceBatchError(f"{where} holds {rows} images; statistics need at least {MIN_ROWS}")
    have = [k for k in ("mu", "sigma", "mu_s", "sigma_s") if k in out]
    if "images" not in out and "pool" not in out and len(have) < 4:
        raise ReferenceBatchError(
            f"{where} holds {sorted(data)}; an ADM reference batch holds arr_0 (images) and/or "
            "mu, sigma, mu_s, sigma_s"
        )
    return out


class ImageBatches:
    """``arr_0`` of a reference batch read ``batch`` images at a time (never all at once),
    as the evaluator's ``StreamingNpzArrayReader``; ``len`` is the image count. Damage found
    while reading (a truncated entry, a bad CRC-32) is ``ReferenceBatchError``."""

    def __init__(self, path: str, shape: tuple[int, ...], flag: str = "--ref"):
        self.path, self.shape, self.flag = path, shape, flag

    def __len__(self) -> int:
        return self.shape[0]

    def batches(self, batch: int) -> Iterator[np.ndarray]:
        header = NpyHeader(self.shape, np.dtype(np.uint8), False)
        where = f"{self.flag}={self.path!r}: arr_0"
        try:
            with open_npy_member(self.path, "arr_0", header, self.flag) as f:
                for start in range(0, self.shape[0], batch):
                    n = min(batch, self.shape[0] - start)
                    out = np.empty((n, *self.shape[1:]), np.uint8)
                    read_exactly(f, out, f"{where} (images {start}..{start + n})")
                    yield out
                if f.read(1):  # to the entry's end: its CRC-32 is checked there
                    raise ReferenceBatchError(f"{where} holds bytes after its {len(self)} images")
        except ReferenceBatchError:
            raise
        except UnreadableFileError as e:
            raise ReferenceBatchError(str(e)) from None
        except ZIP_ERRORS as e:
            raise ReferenceBatchError(f"{where} cannot be read ({reason(e)})") from None


__all__ = [
    "ARITHMETICS",
    "ManifoldEstimator",
    "ReferenceBatchError",
    "inception_score",
    "pairwise_distances",
    "precision_recall",
    "read_reference_batch",
    "write_reference_batch",
]
