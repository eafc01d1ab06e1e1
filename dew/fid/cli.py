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
(``dew.fid.adm.adm_suite``: ``--metrics=fid,sfid,is,precision,recall --ref=<ADM reference batch>``,
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
that instead, resumable the same way (``dew.fid.protocol``). ``ref`` computes a data set's reference
statistics as NVlabs/edm's ``fid.py ref`` does (``dew.scoring.fid_reference``), in its ``.npz``
format plus the resolution and the detector, which ``--preset`` checks against the samples'.
Both feed the Inception uint8 images with ``--image_handling``: ``tf1`` (their default) is the
2015-12-05 TensorFlow graph's resize and scaling, which NVlabs/edm's detector reproduces;
``pytorch_fid`` is pytorch-fid's, which ``--images`` and ``--workdir`` without ``--preset`` use.

Bad input (a missing folder, reference or weights; for ``--workdir`` no such run, a folder that is
not a run, a run that does not draw images, no such step, ``--num_samples`` < 2) exits 2 with one
line naming the flag, and writes nothing.

This module is the command's one road: it parses and checks every flag of every mode (the
parser records the mode and parses ``--metrics``; no file is read yet), starts the platform as
``python -m dew.sample`` does (``dew.runtime.platform.start_for``: the compilation cache, so a
second command reuses the first's compiled programs, and on a CPU its rules) and hands each mode
to one function, which reads the files the flags name and runs the mode: ``dew.fid.reference.reference``
(``ref``), ``dew.fid.protocol.protocol`` (``--preset``: FID or ADM's suite),
``dew.fid.adm.adm_suite`` (ADM's suite of ``--images`` / ``--workdir``) and
``dew.fid.score.score`` (``fid``, ``fd_dinov2``, KID of ``--images`` / ``--workdir``). A mode's
bad input is a ``FidError`` (or the scoring layer's ``FidInputError`` / ``ReferenceBatchError``),
printed here as one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dew.fid.inputs import DEFAULT_NUM_SAMPLES, FidError, Parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dew.fid``: parse and check, hand the mode to its function; 0, or 2 with one line.

    The mode's parser reads and checks its flags (``ref_args``, ``protocol_args``,
    ``parse_args``) and records the mode; its one function reads the files they name and runs
    it: ``dew.fid.reference.reference``, ``dew.fid.protocol.protocol``,
    ``dew.fid.adm.adm_suite`` or ``dew.fid.score.score``."""
    from dew.fid.adm import adm_suite
    from dew.fid.protocol import protocol
    from dew.fid.reference import reference
    from dew.fid.score import score
    from dew.scoring.adm_evaluator import ReferenceBatchError
    from dew.scoring.images import FidInputError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["ref"]:
            args = ref_args(argv[1:])
        elif any(a == "--preset" or a.startswith("--preset=") for a in argv):
            args = protocol_args(argv)
        else:
            args = parse_args(argv)
        from dew.runtime import platform

        # before JAX starts, as python -m dew.sample: the compilation cache (a second command on
        # an accelerator reuses the first's programs) and, on a CPU, its convolution rule
        platform.start_for(
            "python -m dew.fid", say=False, warn=False, present_devices=False, detect_processes=False
        )
        if args.mode == "ref":
            return reference(args)
        if args.mode == "preset":
            return protocol(args)
        if args.mode == "adm":
            return adm_suite(args)
        return score(args)
    except (FidError, FidInputError, ReferenceBatchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# --- --images / --workdir -----------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``--images`` / ``--workdir``'s flags, checked before any file is read (mode ``adm`` when
    ``--metrics`` names one of ADM's own metrics: ``check_adm_flags``; else ``images``:
    ``check_score_flags``; then ``check_run_flags``), ``--metrics`` parsed; a malformed or
    inconsistent one raises ``FidError``."""
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
    _add_pr_arithmetic(parser)
    parser.set_defaults(mode="images")
    parser.add_argument(
        "--allow_unpinned_weights",
        action="store_true",
        help="accept weights not converted from the pinned standard file (tests; FID then not comparable)",
    )
    args = parser.parse_args(argv)
    if wants_adm(args.metrics):  # ADM's suite: its own mode, --metrics its names
        args.mode, args.metrics = "adm", parse_suite(args.metrics)
        check_adm_flags(args)
    else:
        args.metrics = check_score_flags(args)
    check_run_flags(args)
    return args


def check_score_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``fid`` / ``fd_dinov2`` / KID mode's flags, checked before any file is read; its
    ``--metrics`` parsed (``dew.scoring.feature_metrics.parse_metrics``). ``FidError`` naming the
    flag otherwise."""
    from dew.scoring.feature_metrics import parse_metrics

    if args.save_ref_batch:
        raise FidError("--save_ref_batch applies to ADM's suite (--metrics=...,sfid,is,precision,recall)")
    if not args.images and not args.workdir:
        raise FidError("give --images=<folder> or --workdir=<run>")
    try:
        metrics = parse_metrics(args.metrics)
    except ValueError as e:
        raise FidError(str(e)) from None
    if not args.ref and not args.dinov2_ref and not args.save_stats and not args.save_dinov2_stats:
        raise FidError(
            "give --ref=<stats.npz or folder> (or --dinov2_ref) to score against, or --save_stats=<out.npz>"
        )
    wants_dinov2 = "fd_dinov2" in metrics
    given = [f for f in ("dinov2_weights", "dinov2_ref", "save_dinov2_stats") if getattr(args, f)]
    if given and not wants_dinov2:
        raise FidError(f"{', '.join('--' + f for f in given)} only apply with --metrics=...,fd_dinov2")
    if wants_dinov2 and args.kid and "fid" not in metrics:
        raise FidError("--kid is computed in FID Inception features: add fid to --metrics")
    ref_folder = bool(args.ref) and os.path.isdir(args.ref)
    if wants_dinov2 and not args.dinov2_ref and not ref_folder and not args.save_dinov2_stats:
        raise FidError(
            "--metrics=...,fd_dinov2 needs --dinov2_ref=<DINOv2 stats .npz>, a folder --ref, or "
            "--save_dinov2_stats=<out.npz>"
        )
    if args.batch_size < 1 or args.keep_features < 0:
        raise FidError(f"--batch_size={args.batch_size} must be >= 1 and --keep_features >= 0")
    return metrics


def check_adm_flags(args: argparse.Namespace) -> None:
    """ADM's suite's flags (``--metrics`` parsed: ``parse_suite``), checked; ``FidError`` naming
    the flag otherwise."""
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


def check_run_flags(args: argparse.Namespace) -> None:
    """The ``--workdir`` flags of ``--images`` / ``--workdir`` scoring: absent without it,
    ``--num_samples`` >= 2 with it (default 10000)."""
    if not args.workdir:
        given = [f"--{k}" for k in ("step", "num_samples", "seed") if getattr(args, k) is not None]
        if given or args.raw:
            raise FidError(f"{', '.join(given + ['--raw'] * args.raw)} only apply with --workdir=<run>")
        return
    if args.num_samples is None:
        args.num_samples = DEFAULT_NUM_SAMPLES
    if args.num_samples < 2:
        raise FidError(f"--num_samples={args.num_samples}: need at least 2 samples")


def wants_adm(metrics: str) -> bool:
    """``--metrics`` names one of ADM's own metrics (sFID, IS, precision, recall)."""
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


def protocol_metrics(text: str) -> tuple[str, ...]:
    """``--preset``'s ``--metrics``: ``("fid",)`` (the EDM protocol's FID) or ADM's suite
    (``parse_suite``); ``FidError`` for anything else."""
    if wants_adm(text):
        return parse_suite(text)
    if text.strip() != "fid":
        raise FidError(
            f"--metrics={text!r} is invalid with --preset: expected fid, or ADM's suite (a subset of "
            "fid,sfid,is,precision,recall with at least one of sfid, is, precision, recall)"
        )
    return ("fid",)


# --- ADM's suite ----------------------------------------------------------------------------------
def _add_pr_arithmetic(parser: argparse.ArgumentParser) -> None:
    """``--pr_arithmetic``, which both parsers take (the images/run mode and ``--preset``)."""
    parser.add_argument(
        "--pr_arithmetic",
        choices=("float16", "float32"),
        default="float16",
        help="ADM's precision/recall distances: float16 (the evaluator's graph) or float32 (every platform)",
    )


# --- --preset and ref ---------------------------------------------------------------------------
def protocol_args(argv: Sequence[str]) -> argparse.Namespace:
    """The ``--preset`` protocol's flags, checked before any file is read: the numbers, the
    ``--outdir`` not a file, ``--metrics`` parsed (``protocol_metrics``), ADM's suite with the
    graph's own image handling and a reference batch, not a folder, and ``--preset`` a preset's
    name (``dew.objectives.protocol_presets.preset_named``; whether it draws the run's objective
    is checked once the run is loaded). A malformed, missing or inconsistent one raises
    ``FidError`` (``FidInputError`` for the preset's name)."""
    from dew.objectives.protocol_presets import all_presets, preset_named

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
    _add_pr_arithmetic(parser)
    parser.add_argument(
        "--metrics",
        default="fid",
        help="fid (default), or ADM's suite: a subset of fid,sfid,is,precision,recall",
    )
    _detector_flags(parser)
    parser.set_defaults(mode="preset")
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
    args.metrics = protocol_metrics(args.metrics)
    adm = args.metrics != ("fid",)
    if adm and args.image_handling != "tf1":
        raise FidError(
            f"--image_handling={args.image_handling} does not apply to ADM's suite: its evaluator "
            "feeds the TF graph its own way (tf1)"
        )
    preset_named(args.preset)  # a name that is no preset; which run it fits is the run's to say
    if adm and os.path.isdir(args.ref):
        raise FidError(f"--ref={args.ref!r} is a folder; the protocol takes an ADM reference batch .npz")
    return args


def ref_args(argv: Sequence[str]) -> argparse.Namespace:
    """``ref``'s flags, checked; ``FidError`` naming the flag otherwise."""
    parser = Parser(prog="python -m dew.fid ref", description="reference statistics of a data set")
    parser.add_argument("--data", required=True, help="NVlabs/edm data set: a directory or .zip of images")
    parser.add_argument("--dest", required=True, help="the .npz to write (mu, sigma, resolution)")
    parser.add_argument("--batch", type=int, default=64, help="images per step")
    _detector_flags(parser)
    parser.set_defaults(mode="ref")
    args = parser.parse_args(argv)
    if args.batch < 1:
        raise FidError(f"--batch={args.batch} is invalid: expected an int >= 1")
    if not args.dest.endswith(".npz") or os.path.isdir(args.dest):
        raise FidError(f"--dest={args.dest!r} is invalid: expected a path ending in .npz")
    return args


def _detector_flags(parser: argparse.ArgumentParser) -> None:
    from dew.scoring.fid_detector import DEFAULT_HANDLING
    from dew.scoring.inception import IMAGE_HANDLING

    parser.add_argument("--weights", default=None, help="converted Inception .npz")
    parser.add_argument("--allow_unpinned_weights", action="store_true", help="tests only")
    parser.add_argument(
        "--image_handling",
        default=DEFAULT_HANDLING,
        choices=IMAGE_HANDLING,
        help=f"the detector's resize and scaling (default {DEFAULT_HANDLING}: the TF graph's, as fid.py's)",
    )


if __name__ == "__main__":
    sys.exit(main())
