"""ADM's evaluation suite (openai/guided-diffusion ``evaluations/evaluator.py``:
``dew.scoring.adm_evaluator``) of a folder of images or a run's samples, the ``python -m dew.fid``
mode whose ``--metrics`` (parsed by ``dew.fid.cli.parse_args``) name any of ``sfid``, ``is``,
``precision``, ``recall``: ``adm_suite``.

``fid`` beside them is the evaluator's FID (the same pool features, the graph's own TF1 image
handling), not ``--images``' pytorch-fid one. Images are uint8 as the evaluator's batches hold
them (a run's samples quantised as guided-diffusion's ``image_sample.py``: ((x + 1)·127.5)
truncated), fed at their own size. ``--ref`` is ADM's reference-batch ``.npz`` (``arr_0`` images
and/or ``mu``, ``sigma``, ``mu_s``, ``sigma_s``; its stored statistics are used when present, as
the evaluator does; precision and recall embed ``arr_0``, or read dew's ``pool``) or a folder of
images. ``--save_ref_batch`` writes the images' batch in that layout (``arr_0`` included, so the
evaluator itself can read it; held in memory until written). A reference of another resolution
than the samples, and every other bad input, is one line, exit 2, nothing written.

It prints ``<count> <what>`` once the images are scored, then its lines.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from dew.fid.inputs import Samples, Weights, samples


@dataclasses.dataclass(frozen=True)
class AdmJob:
    """What ``adm_suite`` scores, reports and writes, from its checked flags: the ``samples``
    (their resolution read), ADM's ``metrics``, ``--ref`` (a reference batch ``.npz`` or a
    folder; None: none), ``--save_ref_batch``, the weights, the embedding batch and
    ``--pr_arithmetic``."""

    samples: Samples
    metrics: tuple[str, ...]
    ref: str | None
    save_ref_batch: str | None
    weights: Weights
    batch_size: int
    pr_arithmetic: str = "float16"


def adm_job(args: argparse.Namespace) -> AdmJob:
    """The mode's settings from its checked flags (``dew.fid.cli.parse_args``, which parsed
    ``--metrics``): the samples made (``dew.fid.inputs.samples``, their resolution read);
    ``FidError`` naming the flag otherwise."""
    return AdmJob(
        samples=samples(args, resolution=True),
        metrics=args.metrics,
        ref=args.ref,
        save_ref_batch=args.save_ref_batch,
        weights=Weights(args.weights, pinned=not args.allow_unpinned_weights),
        batch_size=args.batch_size,
        pr_arithmetic=args.pr_arithmetic,
    )


def adm_suite(args: argparse.Namespace) -> int:
    """ADM's suite (``--metrics``) of the images or run's samples against ``--ref``, the reference
    batch written where asked: the reference read (``dew.scoring.adm_metrics.reference_batch``),
    the samples made (``adm_job``), then the suite scored
    (``dew.scoring.adm_metrics.suite``); ``FidError`` / ``FidInputError`` /
    ``ReferenceBatchError`` on bad input."""
    from dew.scoring import adm_metrics

    # the reference read and checked before the samples (a run loaded): a bad one costs no load
    reference = adm_metrics.reference_batch(args.ref, args.metrics) if args.ref else None
    job = adm_job(args)
    samples, weights = job.samples, job.weights
    assert samples.resolution is not None  # asked of samples()
    features, scores = adm_metrics.suite(
        job.metrics,
        samples.batches(),
        samples.value_range,
        samples.resolution,
        reference,
        job.ref,
        weights.path,
        pinned=weights.pinned,
        weights_flag=weights.flag,
        batch=job.batch_size,
        keep_images=bool(job.save_ref_batch),
        arithmetic=job.pr_arithmetic,
    )
    print(f"{samples.count} {samples.what}")
    if job.save_ref_batch:
        from dew.scoring.adm_evaluator import write_reference_batch
        from dew.scoring.fid_detector import ADM_DESCRIPTION

        assert features.resolution is not None  # set by the first batch added
        write_reference_batch(
            job.save_ref_batch,
            images=np.concatenate(features.images),
            pool=features.pool,
            stats=features.statistics(),
            resolution=features.resolution,
            detector=ADM_DESCRIPTION,
        )
        print(f"reference batch -> {job.save_ref_batch}")
    for name, value in scores.items():
        print(f"{adm_metrics.LABELS[name]}: {value!r}")
    return 0


__all__ = ["AdmJob", "adm_job", "adm_suite"]
