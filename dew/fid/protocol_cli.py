"""``python -m dew.fid --preset=...`` (the EDM paper's protocol: ``dew.scoring.fid_protocol``) and
``python -m dew.fid ref`` (reference statistics as NVlabs/edm's ``fid.py ref``:
``dew.scoring.fid_reference``); see ``dew.fid.cli`` for every mode's flags."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from dew.fid.inputs import FidError, Parser, load_pipeline


def _protocol_args(argv: Sequence[str]) -> argparse.Namespace:
    """The ``--preset`` protocol's flags; a malformed or missing one raises ``FidError``."""
    from dew.objectives.protocol_presets import all_presets

    parser = Parser(prog="python -m dew.fid --preset=...", description="the EDM paper's FID protocol")
    parser.add_argument("--workdir", required=True, help="a dew run (or one converted from NVlabs/edm)")
    parser.add_argument("--preset", required=True, help=f"the paper's sampler: {', '.join(all_presets())}")
    parser.add_argument("--ref", required=True, help="reference statistics .npz (mu, sigma)")
    parser.add_argument("--outdir", required=True, help="progress, statistics and report go here")
    parser.add_argument("--num", type=int, default=50_000, help="images to draw (default 50000)")
    parser.add_argument("--first_seed", type=int, default=0, help="seed of the first image (default 0)")
    parser.add_argument("--batch", type=int, default=64, help="images per device per step")
    parser.add_argument("--chunk", type=int, default=1000, help="images per progress record")
    parser.add_argument("--max_chunks", type=int, help="stop after this many chunks (rerun to continue)")
    parser.add_argument("--preview", type=int, default=0, help="the first N images as outdir/preview.png")
    parser.add_argument("--step", type=int, help="the checkpoint (default: the latest)")
    parser.add_argument("--raw", action="store_true", help="live weights, not the EMA")
    parser.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() first")
    parser.add_argument(
        "--metrics",
        default="fid",
        help="fid (default), or ADM's suite: a subset of fid,sfid,is,precision,recall",
    )
    _detector_flags(parser)
    args = parser.parse_args(argv)
    for flag, low in (
        ("num", 2),
        ("first_seed", 0),
        ("batch", 1),
        ("chunk", 1),
        ("max_chunks", 1),
        ("preview", 0),
    ):
        value = getattr(args, flag)
        if value is not None and value < low:
            raise FidError(f"--{flag}={value} is invalid: expected an int >= {low}")
    if args.preview > min(args.num, args.chunk):
        raise FidError(
            f"--preview={args.preview} is invalid: expected at most --num and --chunk "
            f"({min(args.num, args.chunk)}): the preview is the first chunk's first images"
        )
    if os.path.exists(args.outdir) and not os.path.isdir(args.outdir):
        raise FidError(f"--outdir={args.outdir!r} is a file; expected a directory (made if missing)")
    if args.first_seed + args.num > 2**31:
        raise FidError(f"--first_seed + --num = {args.first_seed + args.num}: seeds must be < 2**31")
    return args


def _protocol_metrics(text: str) -> tuple[str, ...]:
    """``("fid",)`` (the EDM protocol's FID) or ADM's suite (``dew.fid.adm_cli``'s parse);
    ``FidError`` for anything else."""
    from dew.fid.adm_cli import parse_suite, wants_adm

    if wants_adm(text):
        return parse_suite(text)
    if text.strip() != "fid":
        raise FidError(
            f"--metrics={text!r} is invalid with --preset: expected fid, or ADM's suite (a subset of "
            "fid,sfid,is,precision,recall with at least one of sfid, is, precision, recall)"
        )
    return ("fid",)


def protocol_main(argv: Sequence[str]) -> int:
    """``--preset``: draw, resume, report (``dew.scoring.fid_protocol``); exit 2 on bad input.
    ``--metrics`` naming ADM's suite goes to ``dew.fid.adm_protocol_cli``."""
    from dew.objectives.protocol_presets import preset_named, resolve
    from dew.scoring import fid_protocol as fp
    from dew.scoring.fid_reference import FidInputError, check_reference, file_digest, load_reference
    from dew.scoring.inception import FEATURE_DIM

    try:
        args = _protocol_args(argv)
        metrics = _protocol_metrics(args.metrics)
        if metrics != ("fid",):
            from dew.fid.adm_protocol_cli import adm_protocol_main

            return adm_protocol_main(args, metrics)
        preset_named(args.preset)  # an unknown name before the run loads
        ref = load_reference(args.ref, dim=FEATURE_DIM)  # before the run loads
        if args.distributed:
            import jax

            jax.distributed.initialize()
        task = load_pipeline(argparse.Namespace(workdir=args.workdir, step=args.step, raw=args.raw))
        sampler = resolve(args.preset, task.objective)
        resolution = tuple(
            (getattr(task.objective, "image_shape", None) or task.objective.input_spec.sample.shape)[:2]
        )
        fp.model_classes(task.objective)
        check_reference(ref, args.ref, resolution, None, args.image_handling)
        detector = _detector(args)
        check_reference(ref, args.ref, resolution, detector.dim)
        flags = {k: getattr(args, k) for k in ("num", "outdir", "first_seed", "batch", "chunk", "preview")}
        identity = {"workdir": os.path.abspath(args.workdir), "step": task.step, "raw": bool(args.raw)}
        draw = fp.Draw(task.objective, task.params, sampler, detector, identity=identity, **flags)
        if os.path.isdir(args.outdir):
            fp.FidTally(detector.dim).resume(args.outdir, draw.settings())  # another draw's: refused now
    except (FidError, FidInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.outdir, exist_ok=True)
    sums = draw.run(max_chunks=args.max_chunks)
    if sums is None:
        return 0
    report = fp.fid_report(sums, draw, ref, args.ref, file_digest(args.ref))
    import jax

    if jax.process_index() == 0:
        fp.write_results(args.outdir, sums, report, resolution)
    print(json.dumps(report, indent=1))
    print(f"FID {report['fid']!r}")
    return 0


def _detector_flags(parser: argparse.ArgumentParser) -> None:
    from dew.scoring.fid_reference import DEFAULT_HANDLING
    from dew.scoring.inception import IMAGE_HANDLING

    parser.add_argument("--weights", default=None, help="converted Inception .npz")
    parser.add_argument("--allow_unpinned_weights", action="store_true", help="tests only")
    parser.add_argument(
        "--image_handling",
        default=DEFAULT_HANDLING,
        choices=IMAGE_HANDLING,
        help=f"the detector's resize and scaling (default {DEFAULT_HANDLING}: the TF graph's, as fid.py's)",
    )


def _detector(args: argparse.Namespace):
    from dew.scoring.fid_reference import inception_detector

    try:
        return inception_detector(
            args.weights, pinned=not args.allow_unpinned_weights, handling=args.image_handling
        )
    except (OSError, ValueError) as e:
        raise FidError(f"--weights: {e}") from None


def ref_main(argv: Sequence[str]) -> int:
    """``ref --data=DIR|ZIP --dest=FILE.npz``: a data set's reference statistics, as NVlabs/edm's
    ``fid.py ref`` computes them (``dew.scoring.fid_reference``); exit 2 on bad input."""
    from dew.scoring.fid_reference import (
        FidInputError,
        dataset_files,
        reference_statistics,
        save_reference,
    )

    parser = Parser(prog="python -m dew.fid ref", description="reference statistics of a data set")
    parser.add_argument("--data", required=True, help="NVlabs/edm data set: a directory or .zip of images")
    parser.add_argument("--dest", required=True, help="the .npz to write (mu, sigma, resolution)")
    parser.add_argument("--batch", type=int, default=64, help="images per step")
    _detector_flags(parser)
    try:
        args = parser.parse_args(argv)
        if args.batch < 1:
            raise FidError(f"--batch={args.batch} is invalid: expected an int >= 1")
        if not args.dest.endswith(".npz") or os.path.isdir(args.dest):
            raise FidError(f"--dest={args.dest!r} is invalid: expected a path ending in .npz")
        files = dataset_files(args.data)
        detector = _detector(args)
        sums, resolution = reference_statistics(files, detector, args.batch)
    except (FidError, FidInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mu, sigma = sums.mu_sigma()
    save_reference(
        args.dest, mu, sigma, resolution=resolution, num_images=sums.count, detector=detector.description
    )
    print(f"{sums.count} images at {resolution[0]}x{resolution[1]} -> {args.dest}")
    return 0
