"""The ``python -m dew.fid`` mode on a folder of images or a run's samples whose ``--metrics`` are
``fid`` and ``fd_dinov2`` (and KID beside FID): ``score``, every metric in one pass over the same
batches (``dew.scoring.feature_metrics``). ADM's suite has its own mode (``dew.fid.adm``).

It prints ``<count> <what>`` once the images are scored, then its lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from dew.fid.inputs import FidError, Samples, list_images, samples


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


def score(args: argparse.Namespace) -> int:
    """``--metrics`` (``fid`` / ``fd_dinov2``, and KID) of the images or run's samples against their
    references: the flags checked and the files they name read (``check``), then the metrics
    (the references read, a folder ``--ref`` embedded here), the statistics saved where asked;
    ``FidError`` on bad input."""
    from dew.scoring.feature_metrics import LABELS, scorers
    from dew.scoring.feature_scorer import statistics_over
    from dew.scoring.feature_set import FeatureSet, score_sets
    from dew.scoring.statistics import save_statistics

    job = check(args)
    try:
        metric_scorers = scorers(job.metrics, job.weights, job.dinov2_weights, pinned=job.pinned)
    except (OSError, ValueError) as e:
        raise FidError(str(e)) from None
    samples, reference = job.samples, job.reference_images
    try:
        keep = {"fid": max(job.keep_features, samples.count if job.kid else 0)}
        stats = statistics_over(
            metric_scorers, samples.batches(), samples.value_range, keep, batch_size=samples.batch_size
        )
        refs: dict[str, Any] = {}
        if reference is not None:  # KID's rows: every reference image's
            ref_keep = {"fid": reference.count if job.kid else 0}
            refs = statistics_over(
                metric_scorers,
                reference.batches(),
                reference.value_range,
                ref_keep,
                batch_size=reference.batch_size,
            )
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


def check(args: argparse.Namespace) -> ScoreJob:
    """The files the mode's checked flags (``dew.fid.cli.parse_args``, which parsed ``--metrics``)
    name, read or checked before any work: the folders listed (``--images``, a folder ``--ref``),
    the statistics files read by metric name (``--dinov2_ref``; a file ``--ref``, with features
    for ``--kid``), the FID Inception weights checked present and an ``.npz`` (with ``fid``; read
    whole and checked against their pins by the scorers, after the run), then the samples made
    (``dew.fid.inputs.samples``: the run loaded last, its pipeline starting the platform before
    anything starts JAX). ``FidError`` naming the flag otherwise. Returns the mode's settings."""
    from dew.npz import NotAnNpzError, open_npz
    from dew.scoring.convert_inception import CONVERT, weights_file
    from dew.scoring.statistics import load_statistics

    metrics = args.metrics
    fid = "fid" in metrics
    ref_folder = bool(args.ref) and os.path.isdir(args.ref)
    if args.images:
        list_images(args.images, "--images")
    ref_images = None
    if ref_folder:
        files = list_images(args.ref, "--ref")
        ref_images = Samples(len(files), f"images in {args.ref}", args.batch_size, files=files)
    named = {
        "fd_dinov2": ("--dinov2_ref", args.dinov2_ref if "fd_dinov2" in metrics else None),
        "fid": ("--ref", args.ref if fid and not ref_folder else None),
    }
    references = {}
    for metric, (flag, path) in named.items():
        if path:
            try:
                references[metric] = load_statistics(path)
            except (OSError, ValueError) as e:
                raise FidError(f"{flag}: {e}") from None
    if args.kid and "features" not in references.get("fid", {"features": None}):
        raise FidError(f"--ref={args.ref!r} holds no 'features' for --kid (save them with --keep_features)")
    if fid:  # in the words of every reader of them (read_checked, once the run is loaded)
        try:
            with open_npz(weights_file(args.weights), "FID Inception weights") as data:
                data.files  # noqa: B018  the archive's directory is read: a zip, not just named .npz
        except FileNotFoundError as e:
            raise FidError(f"--weights: {e}") from None
        except NotAnNpzError as e:
            raise FidError(f"--weights: {e}; {CONVERT}") from None
    return ScoreJob(
        samples=samples(args),
        metrics=metrics,
        references=references,
        reference_images=ref_images,
        kid=args.kid,
        keep_features=args.keep_features,
        save_stats=args.save_stats,
        save_dinov2_stats=args.save_dinov2_stats,
        weights=args.weights,
        dinov2_weights=args.dinov2_weights,
        pinned=not args.allow_unpinned_weights,
    )


__all__ = ["ScoreJob", "check", "score"]
