"""``python -m dew.fid``: FID / KID of a folder of images, or of a run's samples, in the standard
Inception feature space.

    python -m dew.fid --images=samples/ --ref=real_stats.npz [--kid]
    python -m dew.fid --workdir=runs/edm --ref=real_stats.npz [--num_samples=10000] [--seed=S]
        [--step=N] [--raw] [--kid]
    python -m dew.fid --images=real/ --save_stats=real_stats.npz [--keep_features=10000]
    python -m dew.fid --images=samples/ --ref=real/            (reference statistics computed too)
    python -m dew.fid --workdir=runs/edm --preset=cifar10 --ref=cifar10-32x32.npz --outdir=fid/
        [--num=50000] [--first_seed=0] [--batch=64] [--chunk=1000] [--max_chunks=K] [--distributed]
        [--preview=64] [--image_handling=tf1]
    python -m dew.fid --workdir=runs/x --preset=imagenet64 --metrics=fid,sfid,is,precision,recall
        --ref=VIRTUAL_imagenet256_labeled.npz --outdir=adm/      (ADM's suite in the protocol)
    python -m dew.fid ref --data=datasets/cifar10-32x32.zip --dest=fid-refs/cifar10-32x32.npz
        [--image_handling=tf1]
    python -m dew.fid --images=samples/ --metrics=fid,fd_dinov2 --ref=real/   (or --ref=fid.npz
        --dinov2_ref=dinov2.npz) [--dinov2_weights=dinov2_vitl14.npz] [--save_dinov2_stats=out.npz]

``--metrics`` (default ``fid``) names what to report from one pass over the same batches
(``dew.scoring.feature_metrics``): ``fid`` and ``fd_dinov2`` (FD_DINOv2, DINOv2 ViT-L/14 features
as NVlabs/edm2 computes them; weights converted by ``python -m dew.scoring.dinov2_weights``).
Any of ``sfid``, ``is``, ``precision``, ``recall`` selects ADM's evaluation suite instead
(``dew.fid.adm_cli``: ``--metrics=fid,sfid,is,precision,recall --ref=<ADM reference batch>``,
``--save_ref_batch=out.npz``).

Images are PNG/JPEG files of one size (as pytorch-fid, which batches them), read as RGB in [0, 1],
resized to 299×299 and embedded by the FID Inception (``dew.scoring.inception``) with weights
converted once by ``python -m dew.scoring.convert_inception``; statistics are streamed in float64
(``dew.scoring.statistics``). ``--ref`` is an ``.npz`` with ``mu``/``sigma`` (the format other
FID tools read and write) or a folder of images.

``--workdir`` (instead of ``--images``) scores ``--num_samples`` samples (default 10,000) drawn
through the run's ``dew.pipeline`` (its debiased EMA at the latest checkpoint, or ``--step``;
``--raw`` for the live weights). Each draw is the task's default one, the run's preview settings
(``per_class`` of every class; one compiled sampler for all draws), draw ``i`` with seed
``--seed + i`` (default seed: the run's own, so draw 0 is its preview); the last draw is cut to
the samples still needed taking the classes in turn, so class counts differ by at most one.
Samples in [−1, 1] go straight into the statistics (one channel repeated to three, as for
images), ``--batch_size`` at a time; progress goes to stderr.

``--preset`` runs the EDM paper's protocol (``dew.scoring.fid_protocol``): ``--num`` images
(50,000) from seeds ``--first_seed`` … (each image from its own seed, so any sharding draws the
same images) at the preset's sampler (``cifar10``: 18 Heun steps, NFE 35; ``ffhq``/``afhqv2``:
40, NFE 79; ``imagenet64``: EDM's stochastic sampler, 256 steps; for DiT's, SiT's and REPA's
objectives ``dit``, ``sit``, ``repa``: ``dew.objectives.protocol_presets``), ``--batch`` images per device
over every device and process, resumable in ``--outdir`` (rerun the same command after an
interruption; ``--max_chunks`` stops after that many chunks). It prints and writes
(``<outdir>/fid.json``) the FID with its inputs; ``--preview=N`` also writes the first N of the
images it embedded as ``<outdir>/preview.png``; with ``--metrics`` naming ADM's suite it reports
that instead, resumable the same way (``dew.fid.adm_protocol_cli``). ``ref`` computes a data set's reference
statistics as NVlabs/edm's ``fid.py ref`` does (``dew.scoring.fid_reference``), in its ``.npz``
format plus the resolution and the detector, which ``--preset`` checks against the samples'.
Both feed the Inception uint8 images with ``--image_handling``: ``tf1`` (their default) is the
2015-12-05 TensorFlow graph's resize and scaling, which NVlabs/edm's detector reproduces;
``pytorch_fid`` is pytorch-fid's, which ``--images`` and ``--workdir`` without ``--preset`` use.

Bad input (a missing folder, reference or weights; for ``--workdir`` no such run, a folder that is
not a run, a run that does not draw images, no such step, ``--num_samples`` < 2) exits 2 with one
line naming the flag, and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from dew.fid.inputs import (  # noqa: F401  (list_images, read_batches, draw_batches: public here too)
    DEFAULT_NUM_SAMPLES,
    EXTENSIONS,
    FidError,
    Parser,
    check_run_flags,
    draw_batches,
    list_images,
    load_pipeline,
    read_batches,
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags; a malformed one raises ``FidError``."""
    assert __doc__ is not None  # the description is the module docstring
    parser = Parser(prog="python -m dew.fid", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--images", help="folder of images to score")
    source.add_argument("--workdir", help="a dew run: samples drawn through its pipeline")
    parser.add_argument("--step", type=int, help="with --workdir: the checkpoint (default: the latest)")
    parser.add_argument("--raw", action="store_true", help="with --workdir: live weights, not the EMA")
    parser.add_argument("--num_samples", type=int, help="with --workdir: samples to draw (default 10000)")
    parser.add_argument("--seed", type=int, help="with --workdir: first draw's seed (default: the run's)")
    parser.add_argument("--ref", help="reference: .npz with mu/sigma (and features for KID), or a folder")
    parser.add_argument("--save_stats", help="write the images' statistics to this .npz")
    parser.add_argument("--keep_features", type=int, default=0, help="features kept in --save_stats (KID)")
    parser.add_argument("--kid", action="store_true", help="also report KID (needs features on both sides)")
    parser.add_argument(
        "--weights", default=None, help="converted Inception .npz (default: see convert_inception)"
    )
    parser.add_argument("--batch_size", type=int, default=50)
    parser.add_argument(
        "--metrics",
        default="fid",
        help="comma-separated: fid, fd_dinov2; or ADM's fid, sfid, is, precision, recall",
    )
    parser.add_argument("--dinov2_weights", default=None, help="converted DINOv2 .npz (see dinov2_weights)")
    parser.add_argument("--dinov2_ref", help="FD_DINOv2 reference .npz; a folder --ref serves both")
    parser.add_argument("--save_dinov2_stats", help="write the images' DINOv2 statistics to this .npz")
    parser.add_argument("--save_ref_batch", help="ADM's suite: write the images' reference batch (.npz)")
    parser.add_argument(
        "--pr_arithmetic",
        choices=("float16", "float32"),
        default="float16",
        help="ADM's precision/recall distances: float16 (the evaluator's graph) or float32 (every platform)",
    )
    parser.add_argument(
        "--allow_unpinned_weights",
        action="store_true",
        help="accept weights not converted from the pinned standard file (tests; FID then not comparable)",
    )
    return parser.parse_args(argv)


def _check_reference_and_weights(args: argparse.Namespace) -> None:
    """``--ref`` readable (with features for ``--kid``) and the Inception weights present."""
    if args.ref and not os.path.isdir(args.ref):
        from dew.scoring.statistics import load_statistics

        try:
            ref = load_statistics(args.ref)
        except (OSError, ValueError) as e:
            raise FidError(f"--ref: {e}") from None
        if args.kid and "features" not in ref:
            raise FidError(
                f"--ref={args.ref!r} holds no 'features' for --kid (save them with --keep_features)"
            )
    elif args.ref:
        list_images(args.ref, "--ref")
    from dew.scoring.convert_inception import default_path

    weights = os.path.expanduser(args.weights) if args.weights else default_path()
    if not os.path.isfile(weights):
        from dew.scoring.convert_inception import HOW_TO_GET

        raise FidError(f"FID Inception weights not found at {weights}: {HOW_TO_GET}")
    from dew.npz import NotAnNpzError, open_npz

    flag = "--weights" if args.weights else "the FID Inception weights"
    try:
        with open_npz(weights, flag) as data:
            data.files  # noqa: B018  the archive's directory is read: a zip, not just named .npz
    except NotAnNpzError as e:
        raise FidError(f"{e}; convert them with python -m dew.scoring.convert_inception") from None


def _check(args: argparse.Namespace) -> Any:
    """Validate everything before any work; returns the image files, or the run's pipeline."""
    if not args.images and not args.workdir:
        raise FidError("give --images=<folder> or --workdir=<run>")
    from dew.scoring.feature_metrics import parse_metrics

    try:
        args.metrics = parse_metrics(args.metrics)
    except ValueError as e:
        raise FidError(str(e)) from None
    if not args.ref and not args.dinov2_ref and not args.save_stats and not args.save_dinov2_stats:
        raise FidError(
            "give --ref=<stats.npz or folder> (or --dinov2_ref) to score against, or --save_stats=<out.npz>"
        )
    _check_dinov2_flags(args)
    if args.batch_size < 1 or args.keep_features < 0:
        raise FidError(f"--batch_size={args.batch_size} must be >= 1 and --keep_features >= 0")
    check_run_flags(args)
    files = list_images(args.images, "--images") if args.images else []
    if "fid" in args.metrics:
        _check_reference_and_weights(args)
    elif args.ref and os.path.isdir(args.ref):
        list_images(args.ref, "--ref")
    return files if args.images else load_pipeline(args)


def _check_dinov2_flags(args: argparse.Namespace) -> None:
    from dew.scoring.feature_metrics import check_flags

    try:
        check_flags(args)
    except ValueError as e:
        raise FidError(str(e)) from None


def _scorers(args: argparse.Namespace) -> dict[str, Any]:
    from dew.scoring.feature_metrics import scorers

    try:
        return scorers(args)
    except (OSError, ValueError) as e:
        raise FidError(str(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["ref"]:
        from dew.fid.protocol_cli import ref_main

        return ref_main(argv[1:])
    if any(a == "--preset" or a.startswith("--preset=") for a in argv):
        from dew.fid.protocol_cli import protocol_main

        return protocol_main(argv)
    try:
        args = parse_args(argv)
        from dew.fid.adm_cli import wants_adm

        if wants_adm(args.metrics):
            from dew.fid.adm_cli import run

            return run(args)
        if args.save_ref_batch:
            raise FidError("--save_ref_batch applies to ADM's suite (--metrics=...,sfid,is,precision,recall)")
        source = _check(args)
        scorers = _scorers(args)
    except FidError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from dew.scoring import distances
    from dew.scoring.feature_metrics import LABELS, frechet_distances, statistics_over
    from dew.scoring.statistics import load_statistics

    if args.images:
        count, what = len(source), f"images in {args.images}"
        batches, value_range = read_batches(source, args.batch_size), (0.0, 1.0)
    else:
        seed = source.options["seed"] if args.seed is None else args.seed
        count, what = args.num_samples, f"samples from {source!r}, seed {seed}"
        batches, value_range = draw_batches(source, count, seed, args.batch_size), (-1.0, 1.0)
    keep = {"fid": max(args.keep_features, count if args.kid else 0)}
    refs: dict[str, Any] = {}
    try:
        all_stats = statistics_over(scorers, batches, value_range, keep)
        if args.ref and os.path.isdir(args.ref):
            ref_files = list_images(args.ref, "--ref")
            ref_keep = {"fid": len(ref_files) if args.kid else 0}
            for name, s in statistics_over(
                scorers, read_batches(ref_files, args.batch_size), (0.0, 1.0), ref_keep
            ).items():
                refs[name] = {"mu": s.mu, "sigma": s.sigma}
                if name == "fid" and args.kid:
                    refs[name]["features"] = s.features
        elif args.ref and "fid" in scorers:
            refs["fid"] = load_statistics(args.ref)
        if args.dinov2_ref:
            refs["fd_dinov2"] = load_statistics(args.dinov2_ref)
        distances_by_metric = frechet_distances({k: v for k, v in all_stats.items() if k in refs}, refs)
    except (FidError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{count} {what}")
    from dew.scoring.statistics import save_statistics

    for name, path, kept_rows in (
        ("fid", args.save_stats, args.keep_features),
        ("fd_dinov2", args.save_dinov2_stats, 0),
    ):
        if path and name in all_stats:
            s = all_stats[name]
            save_statistics(path, s.mu, s.sigma, s.features[:kept_rows] if kept_rows else None)
            print(f"{'' if name == 'fid' else LABELS[name] + ' '}statistics -> {path}")
    for name, value in distances_by_metric.items():
        print(f"{LABELS[name]} {value!r}")  # in full, as pytorch-fid prints FID
        if name == "fid" and args.kid:
            mean, std = distances.kernel_distance(all_stats["fid"].features, refs["fid"]["features"])
            print(f"KID {mean:.6f} ± {std:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
