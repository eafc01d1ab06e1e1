"""ADM's metrics over image batches: the Inception outputs its evaluator reads, streamed into what
each metric needs (``dew.scoring.adm_evaluator`` holds the metrics' own rules).

``AdmScorer`` embeds uint8 images [n, H, W, 3] (fed at their own size through the graph's TF1
resize: ``inception.adm_features``) into pool [n, 2048] and spatial [n, 2023] features, ``batch``
images per compiled call (the last call padded). ``AdmFeatures`` accumulates one image set: the
pool and spatial statistics (float64, ``FeatureStatistics``), the pool rows (precision and
recall need every one) and, when asked, the softmax rows (Inception Score) and the images
themselves (for ``arr_0`` of a reference batch). ``scores`` turns samples' and a reference's
features into the requested metrics.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dew.scoring import adm_evaluator as adm
from dew.scoring.feature_scorer import fixed_batches
from dew.scoring.feature_set import FeatureSet, score_sets

METRICS = ("fid", "sfid", "is", "precision", "recall")
ADM_ONLY = ("sfid", "is", "precision", "recall")
LABELS = {"fid": "FID", "sfid": "sFID", "is": "Inception Score", "precision": "Precision", "recall": "Recall"}


def quantize(images: np.ndarray, value_range: tuple[float, float]) -> np.ndarray:
    """uint8 images from ``value_range``: [−1, 1] as guided-diffusion's ``image_sample.py``
    writes its batches, ``((x + 1) · 127.5).clamp(0, 255).to(uint8)`` (truncation); [0, 1]
    (pixels read from 8-bit files) rounded back to their integer values."""
    x = np.asarray(images, np.float32)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    lo, hi = value_range
    if (lo, hi) == (-1.0, 1.0):
        return np.clip((x + 1) * 127.5, 0, 255).astype(np.uint8)
    return np.clip(np.rint((x - lo) / (hi - lo) * 255.0), 0, 255).astype(np.uint8)


def softmax(logits: Any) -> np.ndarray:
    """float32 softmax over the last axis (``tf.nn.softmax``'s max-shifted form), the classifier's
    output the evaluator reads."""
    x = np.asarray(logits, np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


class AdmScorer:
    """The FID Inception's pool and ``mixed_6/conv`` features and the classifier's softmax, from
    the converted weights at ``weights_path`` read once (``digest``: their content digest)."""

    def __init__(self, weights_path: str | None = None, *, pinned: bool = True, batch: int = 50):
        import jax

        from dew.scoring import inception
        from dew.scoring.convert_inception import classifier, content_sha256, read_checked

        path, arrays = read_checked(weights_path, pinned=pinned)  # the file read once, checked
        self.params = inception.params_from_torch_names(arrays)
        self.classifier = classifier(path, arrays)
        self.digest = content_sha256(arrays)  # the converted file's __content_sha256__, verified
        self.batch = batch
        self._features = jax.jit(inception.adm_features)
        self._logits = jax.jit(inception.logits)

    def features(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pool [n, 2048], spatial [n, 2023]) float32 of uint8 images [n, H, W, 3]."""
        pools, spatials = [], []
        for start in range(0, len(images), self.batch):
            part = images[start : start + self.batch]
            n = len(part)
            if n < self.batch:
                part = np.concatenate([part, np.repeat(part[-1:], self.batch - n, axis=0)])
            pool, spatial = self._features(self.params, part.astype(np.float32))
            pools.append(np.asarray(pool)[:n])
            spatials.append(np.asarray(spatial)[:n])
        return np.concatenate(pools), np.concatenate(spatials)

    def probabilities(self, pool: np.ndarray) -> np.ndarray:
        """Softmax rows [n, 1008] of pool rows [n, 2048]: the classifier's logits, then
        ``softmax``."""
        return softmax(self._logits(pool, self.classifier))


class AdmFeatures:
    """What one image set contributes to ADM's metrics, accumulated batch by batch."""

    def __init__(self, scorer: AdmScorer, *, softmax: bool, keep_images: bool = False):
        from dew.scoring.statistics import FeatureStatistics

        self.scorer, self.softmax, self.keep_images = scorer, softmax, keep_images
        self.pool_stats, self.spatial_stats = FeatureStatistics(), FeatureStatistics()
        self.pools: list[np.ndarray] = []
        self.probs: list[np.ndarray] = []
        self.images: list[np.ndarray] = []
        self.resolution: tuple[int, int] | None = None

    def add(self, images: np.ndarray) -> None:
        """uint8 [n, H, W, 3]; every batch must have the first one's resolution."""
        resolution = (int(images.shape[1]), int(images.shape[2]))
        if self.resolution is not None and resolution != self.resolution:
            raise ValueError(f"images of {resolution} after {self.resolution}: one resolution per set")
        self.resolution = resolution
        pool, spatial = self.scorer.features(images)
        self.pool_stats.update(pool.astype(np.float64))
        self.spatial_stats.update(spatial.astype(np.float64))
        self.pools.append(pool)
        if self.softmax:
            self.probs.append(self.scorer.probabilities(pool))
        if self.keep_images:
            self.images.append(np.asarray(images, np.uint8))

    def add_all(self, batches: Iterable[np.ndarray]) -> AdmFeatures:
        for images in batches:
            self.add(images)
        return self

    @property
    def pool(self) -> np.ndarray:
        return np.concatenate(self.pools)

    def feature_set(self) -> FeatureSet:
        """The set's ``FeatureSet``: its pool and spatial moments, pool rows and softmax rows."""
        return FeatureSet.of_adm(self.statistics(), lambda: self.pool, lambda: np.concatenate(self.probs))

    def statistics(self) -> dict[str, np.ndarray]:
        return {
            "mu": self.pool_stats.mu,
            "sigma": self.pool_stats.sigma,
            "mu_s": self.spatial_stats.mu,
            "sigma_s": self.spatial_stats.sigma,
        }


def evaluate(
    metrics: Sequence[str],
    batches: Iterable[np.ndarray],
    value_range: tuple[float, float],
    reference: dict[str, Any] | None,
    scorer: AdmScorer,
    *,
    batch: int,
    keep_images: bool = False,
    arithmetic: str = "float16",
) -> tuple[AdmFeatures, dict[str, float]]:
    """ADM's suite of one image set: ``batches`` (images in ``value_range``) regrouped into
    ``batch`` rows (``dew.scoring.feature_scorer.fixed_batches``), quantized to the
    evaluator's uint8 (``quantize``) and embedded by ``scorer`` (softmax rows when ``is`` is
    asked, the images kept with ``keep_images``), then, given a ``reference`` (a
    ``reference_batch``; None: none), the reference embedded where a metric needs it
    (``embed_reference``, ``batch`` images at a time) and ``metrics`` scored
    (``dew.scoring.feature_set.score_sets``). Returns
    the samples' features and the scores (empty without a reference)."""
    features = AdmFeatures(scorer, softmax="is" in metrics, keep_images=keep_images)
    # regrouped into ``batch`` rows (the scorer pads the last to its batch): a source that cuts
    # its images smaller (a run's draws) is not padded draw by draw
    features.add_all(quantize(rows[:n], value_range) for rows, n in fixed_batches(batches, batch))
    if reference is None:
        return features, {}
    embedded = embed_reference(reference, scorer, metrics, batch)
    return features, score_sets(metrics, features.feature_set(), FeatureSet.of_adm(embedded), arithmetic)


def weights_scorer(weights: str | None, *, pinned: bool, batch: int, flag: str) -> AdmScorer:
    """``AdmScorer`` of ``python -m dew.fid``'s weights (``--weights``; None: the converted
    default file), ``batch`` images per compiled call; weights it cannot use are one
    ``FidInputError`` line naming ``flag``."""
    from dew.scoring.images import FidInputError

    try:
        return AdmScorer(weights, pinned=pinned, batch=batch)
    except (OSError, ValueError) as e:
        raise FidInputError(f"{flag}: {e}") from None


def protocol_scorer(
    reference: dict[str, Any],
    ref: str,
    resolution: tuple[int, int],
    weights: str | None,
    *,
    pinned: bool,
    batch: int,
    flag: str,
) -> tuple[AdmScorer, Any]:
    """ADM's suite in the FID protocol: the reference batch (``reference_batch`` of ``ref``, read
    before the run) checked against the samples' ``resolution`` (``check_resolution``), then
    ADM's scorer (``weights_scorer``) and the protocol's detector over the weights it read
    (``dew.scoring.fid_detector.adm_detector``)."""
    from dew.scoring.fid_detector import adm_detector

    check_resolution(reference, ref, resolution)
    scorer = weights_scorer(weights, pinned=pinned, batch=batch, flag=flag)
    return scorer, adm_detector(scorer.params, scorer.digest)


def suite(
    metrics: Sequence[str],
    batches: Iterable[np.ndarray],
    value_range: tuple[float, float],
    resolution: tuple[int, int],
    reference: dict[str, Any] | None,
    ref: str | None,
    weights: str | None,
    *,
    pinned: bool,
    weights_flag: str,
    batch: int,
    keep_images: bool = False,
    arithmetic: str = "float16",
) -> tuple[AdmFeatures, dict[str, float]]:
    """``python -m dew.fid``'s ADM suite of one image set at ``resolution``: the reference batch
    (``reference_batch`` of ``ref``, read before the samples; None: none) checked against
    ``resolution`` (``check_resolution``), ADM's scorer read from ``weights`` (``AdmScorer``;
    ``FidInputError`` naming ``weights_flag`` when they cannot be used: ``weights_scorer``),
    then ``evaluate``. Returns the samples' features and the scores."""
    if reference is not None and ref is not None:
        check_resolution(reference, ref, resolution)
    scorer = weights_scorer(weights, pinned=pinned, batch=batch, flag=weights_flag)
    return evaluate(
        metrics,
        batches,
        value_range,
        reference,
        scorer,
        batch=batch,
        keep_images=keep_images,
        arithmetic=arithmetic,
    )


def needs_rows(metrics: Iterable[str]) -> bool:
    """Whether ``metrics`` ask precision or recall, which need every pool row of the reference
    (its images or stored ``pool``, at least ``max(adm.NHOOD_SIZES) + 1`` of them)."""
    return not {"precision", "recall"}.isdisjoint(metrics)


def reference_batch(ref: str, metrics: Sequence[str]) -> dict[str, Any]:
    """``--ref`` of ADM's suite: a reference batch (``adm_evaluator.read_reference_batch``) or a
    folder of images (``dew.scoring.images``: its images as ``FolderImages``, read batch by batch
    as a batch's ``arr_0`` is, its resolution and count), read (not yet embedded) and holding
    what ``metrics`` need; ``ReferenceBatchError`` (a folder's own refusals: ``FidInputError``)
    in one line otherwise. Read before the samples are, so that a bad reference costs no draw;
    the samples' resolution is checked once known (``check_resolution``)."""
    from dew.scoring import images

    rows_needed = needs_rows(metrics)
    if os.path.isdir(ref):
        files = images.list_images(ref, "--ref")
        out = {
            "images": images.FolderImages(files),
            "resolution": images.image_resolution(files),
            "num_images": len(files),
        }
    else:
        out = adm.read_reference_batch(ref)
        has_stats = all(k in out for k in ("mu", "sigma", "mu_s", "sigma_s"))
        if rows_needed and "images" not in out and "pool" not in out:
            raise adm.ReferenceBatchError(
                f"--ref={ref!r} holds statistics only; precision and recall need its arr_0 images"
            )
        if not has_stats and "images" not in out and "pool" not in out:
            raise adm.ReferenceBatchError(f"--ref={ref!r} holds neither statistics nor images")
        if not has_stats and "images" not in out and {"fid", "sfid"} & set(metrics):
            raise adm.ReferenceBatchError(
                f"--ref={ref!r} holds pool rows only; fid and sfid need its mu, sigma, mu_s, sigma_s "
                "or its arr_0 images"
            )
    rows = out.get("num_images") if ("images" in out or "pool" in out) else None
    k = max(adm.NHOOD_SIZES)
    if rows_needed and rows is not None and rows < k + 1:  # each point, its k nearest neighbours
        raise adm.ReferenceBatchError(
            f"--ref={ref!r} holds {rows} images; precision and recall need at least "
            f"{k + 1} (each image's {k} nearest neighbours)"
        )
    return out


def check_resolution(reference: dict[str, Any], ref: str, resolution: tuple[int, int]) -> None:
    """Refuse a ``reference_batch`` (of ``ref``) that records another resolution than the
    samples' [H, W] ``resolution``: ``ReferenceBatchError`` in one line."""
    recorded = reference.get("resolution")
    if recorded is not None and tuple(recorded) != tuple(resolution):
        raise adm.ReferenceBatchError(
            f"--ref={ref!r} is a reference batch at {recorded[0]}x{recorded[1]}, the samples are "
            f"{resolution[0]}x{resolution[1]}; ADM's metrics compare images of one resolution"
        )


def embed_reference(
    reference: dict[str, Any], scorer: AdmScorer, metrics: Sequence[str], batch: int
) -> dict[str, Any]:
    """A ``reference_batch``'s mu/sigma/mu_s/sigma_s (stored ones first, as the evaluator's
    ``read_statistics``) and the pool rows precision and recall need (stored ``pool``, else
    ``arr_0`` or the folder's images embedded by ``scorer``, ``batch`` at a time)."""
    stored = {k: reference[k] for k in ("mu", "sigma", "mu_s", "sigma_s") if k in reference}
    out: dict[str, Any] = {}
    if len(stored) == 4 and (not needs_rows(metrics) or "pool" in reference):
        out.update(stored)
        if "pool" in reference:
            out["pool"] = reference["pool"]
        return out
    if "images" not in reference:  # stored statistics and pool rows
        out.update(stored, pool=reference["pool"])
        return out
    features = AdmFeatures(scorer, softmax=False).add_all(reference["images"].batches(batch))
    out.update(features.statistics())
    out.update(stored)  # the batch's own statistics win, as in the evaluator
    out["pool"] = features.pool
    return out


__all__ = [
    "ADM_ONLY",
    "LABELS",
    "METRICS",
    "AdmFeatures",
    "AdmScorer",
    "check_resolution",
    "embed_reference",
    "evaluate",
    "needs_rows",
    "protocol_scorer",
    "quantize",
    "reference_batch",
    "softmax",
    "suite",
    "weights_scorer",
]
