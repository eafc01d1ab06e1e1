"""``python -m dew.fid --metrics=fid,sfid,is,precision,recall``: ADM's evaluation suite
(openai/guided-diffusion ``evaluations/evaluator.py``; ``dew.scoring.adm_evaluator``) on a folder
of images or a run's samples, against an ADM reference batch or a folder of images.

    python -m dew.fid --images=samples/ --metrics=fid,sfid,is,precision,recall \
        --ref=VIRTUAL_imagenet256_labeled.npz
    python -m dew.fid --workdir=runs/x --num_samples=50000 --metrics=fid,sfid,is,precision,recall \
        --ref=ref_batch.npz
    python -m dew.fid --images=real/ --metrics=fid,sfid,precision,recall --save_ref_batch=ref_batch.npz

Any of ``sfid``, ``is``, ``precision``, ``recall`` in ``--metrics`` selects this mode; ``fid``
beside them is the evaluator's FID (the same pool features, the graph's own TF1 image handling),
not ``--images``' pytorch-fid one. Images are uint8 as the evaluator's batches hold them (a run's
samples quantised as guided-diffusion's ``image_sample.py``: ((x + 1)·127.5) truncated), fed at
their own size. ``--ref`` is ADM's reference-batch ``.npz`` (``arr_0`` images and/or ``mu``,
``sigma``, ``mu_s``, ``sigma_s``; its stored statistics are used when present, as the evaluator
does; precision and recall embed ``arr_0``, or read dew's ``pool``) or a folder of images.
``--save_ref_batch`` writes the images' batch in that layout (``arr_0`` included, so the
evaluator itself can read it; held in memory until written). A reference of another resolution
than the samples, and every other bad input, is one line and exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from dew.fid.inputs import FidError


def wants_adm(metrics: str) -> bool:
    from dew.scoring.adm_metrics import ADM_ONLY

    return any(name.strip() in ADM_ONLY for name in metrics.split(","))


def parse_suite(text: str) -> tuple[str, ...]:
    """``--metrics``' names of ADM's suite, in order; ``FidError`` for another name or a repeat."""
    from dew.scoring.adm_metrics import METRICS

    names = tuple(n.strip() for n in text.split(","))
    if any(n not in METRICS for n in names) or len(set(names)) != len(names):
        raise FidError(
            f"--metrics={text!r}: ADM's suite is a comma-separated subset of {','.join(METRICS)} without "
            "repeats (fd_dinov2 and --kid are scored on their own)"
        )
    return names


def _check(args: argparse.Namespace) -> None:
    args.metrics = parse_suite(args.metrics)
    other = [
        f"--{f}"
        for f in ("save_stats", "dinov2_weights", "dinov2_ref", "save_dinov2_stats")
        if getattr(args, f)
    ]
    other += ["--kid"] * bool(args.kid) + ["--keep_features"] * bool(args.keep_features)
    if other:
        raise FidError(f"{', '.join(other)} do not apply to ADM's suite (--metrics={','.join(args.metrics)})")
    if not args.images and not args.workdir:
        raise FidError("give --images=<folder> or --workdir=<run>")
    if not args.ref and not args.save_ref_batch:
        raise FidError("give --ref=<ADM reference batch .npz or folder> or --save_ref_batch=<out.npz>")
    if args.save_ref_batch and (
        not args.save_ref_batch.endswith(".npz") or os.path.isdir(args.save_ref_batch)
    ):
        raise FidError(f"--save_ref_batch={args.save_ref_batch!r} is invalid: expected a path ending in .npz")
    if args.batch_size < 1:
        raise FidError(f"--batch_size={args.batch_size} must be >= 1")


def _reference(args: argparse.Namespace, resolution: tuple[int, int]) -> dict[str, Any] | None:
    """The reference batch (read, not yet embedded), checked against the samples' resolution."""
    if not args.ref:
        return None
    return reference_batch(args.ref, args.metrics, resolution)


def reference_batch(ref: str, metrics: tuple[str, ...], resolution: tuple[int, int]) -> dict[str, Any]:
    """``--ref``: an ADM reference batch (``read_reference_batch``) or a folder of images, read
    (not yet embedded), holding what ``metrics`` need and checked against the samples'
    ``resolution``; ``FidError`` in one line otherwise."""
    from dew.scoring.adm_evaluator import NHOOD_SIZES

    if os.path.isdir(ref):
        from dew.fid.inputs import list_images

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


def _file_resolution(path: str) -> tuple[int, int]:
    from PIL import Image

    from dew.scoring.fid_reference import decode_image

    def size() -> tuple[int, int]:
        with Image.open(path) as image:
            return image.size[1], image.size[0]

    return decode_image(size, path)


def _image_batches(files: list[str], batch: int) -> Iterator[np.ndarray]:
    from dew.fid.inputs import read_batches
    from dew.scoring.adm_metrics import quantize

    for images in read_batches(files, batch):
        yield quantize(images, (0.0, 1.0))


def run(args: argparse.Namespace) -> int:
    """The ADM mode of ``python -m dew.fid``; exit 2 with one line on bad input."""
    from dew.fid.inputs import check_run_flags, draw_batches, list_images, load_pipeline
    from dew.scoring import adm_metrics
    from dew.scoring.fid_reference import FidInputError

    try:
        _check(args)
        check_run_flags(args)
        files: list[str] = []
        task = None  # the pipeline that draws the samples, without --images
        if args.images:
            files = list_images(args.images, "--images")
            resolution = _file_resolution(files[0])
        else:
            task = load_pipeline(args)
            shape = getattr(task.objective, "image_shape", None) or task.objective.input_spec.sample.shape
            resolution = (int(shape[0]), int(shape[1]))
        reference = _reference(args, resolution)
        try:
            scorer = adm_metrics.AdmScorer(
                args.weights, pinned=not args.allow_unpinned_weights, batch=args.batch_size
            )
        except (OSError, ValueError) as e:
            raise FidError(f"{'--weights' if args.weights else 'the FID Inception weights'}: {e}") from None
        if args.images:
            count, what = len(files), f"images in {args.images}"
            batches = _image_batches(files, args.batch_size)
        else:
            assert task is not None  # loaded above
            seed = task.options["seed"] if args.seed is None else args.seed
            count, what = args.num_samples, f"samples from {task!r}, seed {seed}"
            batches = (
                adm_metrics.quantize(b, (-1.0, 1.0)) for b in draw_batches(task, count, seed, args.batch_size)
            )
        samples = adm_metrics.AdmFeatures(
            scorer, softmax="is" in args.metrics, keep_images=bool(args.save_ref_batch)
        ).add_all(batches)
        scores = (
            adm_metrics.scores(
                args.metrics,
                samples,
                embed_reference(reference, scorer, args.metrics, args.batch_size),
                args.pr_arithmetic,
            )
            if reference
            else {}
        )
    except (FidError, FidInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
