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

import argparse
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dew.fid.inputs import FidError, draw_batches, list_images, load_pipeline, read_batches


def _source(args: argparse.Namespace) -> tuple[int, str, Iterator[np.ndarray], tuple[float, float]]:
    """The images to score: (count, what they are, their batches, their value range)."""
    if args.images:
        files = list_images(args.images, "--images")
        return len(files), f"images in {args.images}", read_batches(files, args.batch_size), (0.0, 1.0)
    task = load_pipeline(args)
    seed = task.options["seed"] if args.seed is None else args.seed
    what = f"samples from {task!r}, seed {seed}"
    return args.num_samples, what, draw_batches(task, args.num_samples, seed, args.batch_size), (-1.0, 1.0)


def score(args: argparse.Namespace, references: dict[str, Any]) -> int:
    """``--metrics`` of ``fid`` / ``fd_dinov2`` (and ``--kid``) of the images against their
    references (``references``: the statistics files already read, by metric name; a folder
    ``--ref`` is embedded here), the statistics saved where asked; ``FidError`` on bad input."""
    from dew.scoring.feature_metrics import LABELS, scorers, statistics_over
    from dew.scoring.feature_set import FeatureSet, frechet, kernel_distance
    from dew.scoring.statistics import save_statistics

    count, what, batches, value_range = _source(args)
    try:
        pinned = not args.allow_unpinned_weights
        metric_scorers = scorers(args.metrics, args.weights, args.dinov2_weights, pinned=pinned)
    except (OSError, ValueError) as e:
        raise FidError(str(e)) from None
    keep = {"fid": max(args.keep_features, count if args.kid else 0)}
    refs: dict[str, Any] = {}
    try:
        stats = statistics_over(metric_scorers, batches, value_range, keep)
        if args.ref and os.path.isdir(args.ref):
            ref_files = list_images(args.ref, "--ref")
            ref_keep = {"fid": len(ref_files) if args.kid else 0}
            batches = read_batches(ref_files, args.batch_size)
            refs = statistics_over(metric_scorers, batches, (0.0, 1.0), ref_keep)
        refs.update(references)
        samples, reference = FeatureSet.of(stats), FeatureSet.of(refs)
        distances = {name: frechet(name, samples, reference) for name in stats if name in refs}
    except ValueError as e:
        raise FidError(str(e)) from None
    print(f"{count} {what}")
    for name, path, kept_rows in (
        ("fid", args.save_stats, args.keep_features),
        ("fd_dinov2", args.save_dinov2_stats, 0),
    ):
        if path and name in stats:
            s = stats[name]
            save_statistics(path, s.mu, s.sigma, s.features[:kept_rows] if kept_rows else None)
            print(f"{'' if name == 'fid' else LABELS[name] + ' '}statistics -> {path}")
    for name, value in distances.items():
        print(f"{LABELS[name]} {value!r}")  # in full, as pytorch-fid prints FID
        if name == "fid" and args.kid:
            mean, std = kernel_distance(samples, reference)
            print(f"KID {mean:.6f} ± {std:.6f}")
    return 0


def adm_suite(args: argparse.Namespace) -> int:
    """ADM's suite (``args.metrics`` parsed) of the images against ``--ref``, the reference batch
    written where asked; ``FidError`` on bad input."""
    from dew.scoring import adm_metrics

    if args.images:
        files = list_images(args.images, "--images")
        resolution = _file_resolution(files[0])
        count, what, batches = len(files), f"images in {args.images}", _image_batches(files, args.batch_size)
    else:
        task = load_pipeline(args)
        shape = getattr(task.objective, "image_shape", None) or task.objective.input_spec.sample.shape
        resolution = (int(shape[0]), int(shape[1]))
        seed = task.options["seed"] if args.seed is None else args.seed
        count, what = args.num_samples, f"samples from {task!r}, seed {seed}"
        draws = draw_batches(task, count, seed, args.batch_size)
        batches = (adm_metrics.quantize(b, (-1.0, 1.0)) for b in draws)
    reference = reference_batch(args.ref, args.metrics, resolution) if args.ref else None
    scorer = adm_scorer(args.weights, args.allow_unpinned_weights, args.batch_size)
    samples = adm_metrics.AdmFeatures(
        scorer, softmax="is" in args.metrics, keep_images=bool(args.save_ref_batch)
    ).add_all(batches)
    scores = {}
    if reference:
        embedded = embed_reference(reference, scorer, args.metrics, args.batch_size)
        scores = adm_metrics.scores(args.metrics, samples, embedded, args.pr_arithmetic)
    print(f"{count} {what}")
    if args.save_ref_batch:
        from dew.scoring.adm_evaluator import write_reference_batch

        assert samples.resolution is not None  # set by the first batch added
        write_reference_batch(
            args.save_ref_batch,
            images=np.concatenate(samples.images),
            pool=samples.pool,
            stats=samples.statistics(),
            resolution=samples.resolution,
            detector="dew inception_fid 2015-12-05 (ADM: pool_3, mixed_6/conv[..., :7]), image handling tf1",
        )
        print(f"reference batch -> {args.save_ref_batch}")
    for name, value in scores.items():
        print(f"{adm_metrics.LABELS[name]}: {value!r}")
    return 0


def adm_scorer(weights: str | None, allow_unpinned: bool, batch: int) -> Any:
    """ADM's scorer (``dew.scoring.adm_metrics.AdmScorer``); ``FidError`` naming the weights."""
    from dew.scoring.adm_metrics import AdmScorer

    try:
        return AdmScorer(weights, pinned=not allow_unpinned, batch=batch)
    except (OSError, ValueError) as e:
        raise FidError(f"{'--weights' if weights else 'the FID Inception weights'}: {e}") from None


def reference_batch(ref: str, metrics: tuple[str, ...], resolution: tuple[int, int]) -> dict[str, Any]:
    """``--ref``: an ADM reference batch (``read_reference_batch``) or a folder of images, read
    (not yet embedded), holding what ``metrics`` need and checked against the samples'
    ``resolution``; ``FidError`` in one line otherwise."""
    from dew.scoring.adm_evaluator import NHOOD_SIZES

    if os.path.isdir(ref):
        files = list_images(ref, "--ref")
        ref_resolution = _file_resolution(files[0])
        out: dict[str, Any] = {"files": files, "resolution": ref_resolution, "num_images": len(files)}
    else:
        from dew.scoring.adm_evaluator import ReferenceBatchError, read_reference_batch

        try:
            out = read_reference_batch(ref)
        except ReferenceBatchError as e:
            raise FidError(str(e)) from None
        needs_rows = {"precision", "recall"} & set(metrics)
        has_stats = all(k in out for k in ("mu", "sigma", "mu_s", "sigma_s"))
        if needs_rows and "images" not in out and "pool" not in out:
            raise FidError(f"--ref={ref!r} holds statistics only; precision and recall need its arr_0 images")
        if not has_stats and "images" not in out and "pool" not in out:
            raise FidError(f"--ref={ref!r} holds neither statistics nor images")
        if not has_stats and "images" not in out and {"fid", "sfid"} & set(metrics):
            raise FidError(
                f"--ref={ref!r} holds pool rows only; fid and sfid need its mu, sigma, mu_s, sigma_s "
                "or its arr_0 images"
            )
    needs_rows = {"precision", "recall"} & set(metrics)
    rows = out.get("num_images") if ("images" in out or "pool" in out or "files" in out) else None
    if needs_rows and rows is not None and rows < max(NHOOD_SIZES) + 1:  # each point, k neighbours
        raise FidError(
            f"--ref={ref!r} holds {rows} images; precision and recall need at least "
            f"{max(NHOOD_SIZES) + 1} (each image's {max(NHOOD_SIZES)} nearest neighbours)"
        )
    recorded = out.get("resolution")
    if recorded is not None and tuple(recorded) != tuple(resolution):
        raise FidError(
            f"--ref={ref!r} is a reference batch at {recorded[0]}x{recorded[1]}, the samples are "
            f"{resolution[0]}x{resolution[1]}; ADM's metrics compare images of one resolution"
        )
    return out


def embed_reference(
    reference: dict[str, Any], scorer: Any, metrics: tuple[str, ...], batch: int
) -> dict[str, Any]:
    """mu/sigma/mu_s/sigma_s (stored ones first, as the evaluator's ``read_statistics``) and the
    pool rows precision and recall need (stored ``pool``, else ``arr_0`` or the folder embedded)."""
    from dew.scoring import adm_metrics

    stored = {k: reference[k] for k in ("mu", "sigma", "mu_s", "sigma_s") if k in reference}
    needs_rows = bool({"precision", "recall"} & set(metrics))
    out: dict[str, Any] = {}
    if len(stored) == 4 and (not needs_rows or "pool" in reference):
        out.update(stored)
        if "pool" in reference:
            out["pool"] = reference["pool"]
        return out
    features = adm_metrics.AdmFeatures(scorer, softmax=False)
    if "files" in reference:
        features.add_all(_image_batches(reference["files"], batch))
    elif "images" in reference:
        features.add_all(reference["images"].batches(batch))
    else:  # stored statistics and pool rows
        out.update(stored, pool=reference["pool"])
        return out
    out.update(features.statistics())
    out.update(stored)  # the batch's own statistics win, as in the evaluator
    out["pool"] = features.pool
    return out


def _file_resolution(path: str) -> tuple[int, int]:
    from PIL import Image

    from dew.scoring.fid_reference import decode_image

    def size() -> tuple[int, int]:
        with Image.open(path) as image:
            return image.size[1], image.size[0]

    return decode_image(size, path)


def _image_batches(files: list[str], batch: int) -> Iterator[np.ndarray]:
    from dew.scoring.adm_metrics import quantize

    for images in read_batches(files, batch):
        yield quantize(images, (0.0, 1.0))


__all__ = ["adm_scorer", "adm_suite", "embed_reference", "reference_batch", "score"]
