"""The modes of ``python -m dew.fid`` on a folder of images or a run's samples (flags read and
checked by ``dew.fid.cli``): ``score`` (``fid``, ``fd_dinov2``, KID in one pass over the same
batches, ``dew.scoring.feature_metrics``) and ``adm_suite`` (ADM's evaluation suite,
openai/guided-diffusion ``evaluations/evaluator.py``: ``dew.scoring.adm_evaluator``).

ADM's suite: any of ``sfid``, ``is``, ``precision``, ``recall`` in ``--metrics`` selects it;
``fid`` beside them is the evaluator's FID (the same pool features, the graph's own TF1 image
handling), not ``--images``' pytorch-fid one. Images are uint8 as the evaluator's batches hold
them (a run's samples quantised as guided-diffusion's ``image_sample.py``: ((x + 1)·127.5)
truncated), fed at their own size. ``--ref`` is ADM's reference-batch ``.npz`` (``arr_0`` images
and/or ``mu``, ``sigma``, ``mu_s``, ``sigma_s``; its stored statistics are used when present, as
the evaluator does; precision and recall embed ``arr_0``, or read dew's ``pool``) or a folder of
images. ``--save_ref_batch`` writes the images' batch in that layout (``arr_0`` included, so the
evaluator itself can read it; held in memory until written). A reference of another resolution
than the samples, and every other bad input, is a ``FidError`` (one line, exit 2), nothing
written.

Both modes print ``<count> <what>`` once the images are scored, then their lines.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dew.fid.inputs import FidError, Samples, Weights


@dataclasses.dataclass(frozen=True)
class ScoreJob:
    """What ``score`` scores, reports and writes, from its checked flags: the ``samples``,
    ``metrics`` (``fid``, ``fd_dinov2``), the reference statistics already read by metric name
    (``references``), a folder ``--ref``'s images (``reference_images``, embedded here), ``--kid``,
    ``--keep_features``, where to save the statistics, and the weights (None: the converted
    default files)."""

    samples: Samples
    metrics: tuple[str, ...]
    references: dict[str, Any]
    reference_images: Samples | None = None
    kid: bool = False
    keep_features: int = 0
    save_stats: str | None = None
    save_dinov2_stats: str | None = None
    weights: str | None = None
    dinov2_weights: str | None = None
    pinned: bool = True


@dataclasses.dataclass(frozen=True)
class AdmJob:
    """What ``adm_suite`` scores, reports and writes, from its checked flags: the ``samples``,
    ADM's ``metrics``, ``--ref`` (a reference batch ``.npz`` or a folder; None: none),
    ``--save_ref_batch``, the weights, the embedding batch and ``--pr_arithmetic``."""

    samples: Samples
    metrics: tuple[str, ...]
    ref: str | None
    save_ref_batch: str | None
    weights: Weights
    batch_size: int
    pr_arithmetic: str = "float16"


def score(job: ScoreJob) -> int:
    """``job.metrics`` (``fid`` / ``fd_dinov2``, and KID) of ``job.samples`` against their references
    (``job.references`` read, ``job.reference_images`` embedded here), the statistics saved where
    asked; ``FidError`` on bad input."""
    from dew.scoring.feature_metrics import LABELS, scorers, statistics_over
    from dew.scoring.feature_set import FeatureSet, score_sets
    from dew.scoring.statistics import save_statistics

    try:
        metric_scorers = scorers(job.metrics, job.weights, job.dinov2_weights, pinned=job.pinned)
    except (OSError, ValueError) as e:
        raise FidError(str(e)) from None
    samples, reference = job.samples, job.reference_images
    keep = {"fid": max(job.keep_features, samples.count if job.kid else 0)}
    refs: dict[str, Any] = {}
    try:
        stats = statistics_over(metric_scorers, samples.batches(), samples.value_range, keep)
        if reference is not None:  # KID's rows: every reference image's
            ref_keep = {"fid": reference.count if job.kid else 0}
            refs = statistics_over(metric_scorers, reference.batches(), reference.value_range, ref_keep)
        refs.update(job.references)
        scored = []  # each metric with a reference; KID (in FID's features) right after FID
        for name in (n for n in stats if n in refs):
            scored += [name, "kid"] if name == "fid" and job.kid else [name]
        results = score_sets(scored, FeatureSet.of(stats), FeatureSet.of(refs))
    except ValueError as e:
        raise FidError(str(e)) from None
    print(f"{samples.count} {samples.what}")
    for name, path, kept_rows in (
        ("fid", job.save_stats, job.keep_features),
        ("fd_dinov2", job.save_dinov2_stats, 0),
    ):
        if path and name in stats:
            s = stats[name]
            save_statistics(path, s.mu, s.sigma, s.features[:kept_rows] if kept_rows else None)
            print(f"{'' if name == 'fid' else LABELS[name] + ' '}statistics -> {path}")
    for name, value in results.items():
        if name == "kid":
            print(f"KID {value[0]:.6f} ± {value[1]:.6f}")
        else:
            print(f"{LABELS[name]} {value!r}")  # in full, as pytorch-fid prints FID
    return 0


def adm_suite(job: AdmJob) -> int:
    """ADM's suite (``job.metrics``) of ``job.samples`` against ``job.ref``, the reference batch
    written where asked; ``FidError`` on bad input."""
    from dew.scoring import adm_metrics

    samples = job.samples
    resolution = samples.resolution()
    reference = adm_metrics.reference_batch(job.ref, job.metrics, resolution) if job.ref else None
    features, scores = adm_metrics.evaluate(
        job.metrics,
        samples.batches(),
        samples.value_range,
        reference,
        job.weights.adm_scorer(job.batch_size),
        batch=job.batch_size,
        keep_images=bool(job.save_ref_batch),
        arithmetic=job.pr_arithmetic,
    )
    print(f"{samples.count} {samples.what}")
    if job.save_ref_batch:
        from dew.scoring.adm_evaluator import write_reference_batch

        assert features.resolution is not None  # set by the first batch added
        write_reference_batch(
            job.save_ref_batch,
            images=np.concatenate(features.images),
            pool=features.pool,
            stats=features.statistics(),
            resolution=features.resolution,
            detector=adm_metrics.DETECTOR,
        )
        print(f"reference batch -> {job.save_ref_batch}")
    for name, value in scores.items():
        print(f"{adm_metrics.LABELS[name]}: {value!r}")
    return 0


__all__ = ["AdmJob", "ScoreJob", "adm_suite", "score"]
