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
(``dew.fid.score.adm_suite``: ``--metrics=fid,sfid,is,precision,recall --ref=<ADM reference batch>``,
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

This module is the command's one road: it parses every flag of every mode, has
``dew.fid.settings`` check them before work starts and turn them into the mode's settings (no mode
sees argparse), and hands each mode to one function: ``dew.fid.score.score``
(``--metrics`` of ``fid``, ``fd_dinov2``, KID), ``dew.fid.score.adm_suite`` (ADM's suite on
images or a run), ``dew.fid.protocol.protocol`` (``--preset``: FID or ADM's suite) and
``dew.fid.protocol.reference`` (``ref``). A mode's bad input is a ``FidError`` (or the scoring
layer's ``FidInputError`` / ``ReferenceBatchError``), printed here as one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dew.fid.inputs import (  # noqa: F401  (list_images, read_batches, draw_batches: public here too)
    DEFAULT_NUM_SAMPLES,
    EXTENSIONS,
    FidError,
    Parser,
    draw_batches,
    list_images,
    load_pipeline,
    read_batches,
)
from dew.fid.settings import (  # noqa: F401  (check ... weights_of: public here too)
    check,
    check_adm,
    parse_suite,
    protocol_metrics,
    protocol_run,
    reference_job,
    samples,
    settings_of,
    wants_adm,
    weights_of,
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dew.fid``: parse, check, hand the mode to its function; 0, or 2 with one line.

    The mode's parser reads its flags (``ref_args``, ``protocol_args``, ``parse_args``), then
    ``dew.fid.settings.settings_of`` checks them and turns them, once, into the mode's settings
    (``ReferenceJob``, ``ProtocolRun``, ``ScoreJob`` or ``AdmJob``, the last two holding the
    ``Samples`` they score); no mode sees argparse."""
    from dew.fid.protocol import ProtocolRun, ReferenceJob, protocol, reference
    from dew.fid.score import AdmJob, adm_suite, score
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
        job = settings_of(args)
        if isinstance(job, ReferenceJob):
            return reference(job)
        if isinstance(job, ProtocolRun):
            return protocol(job)
        return adm_suite(job) if isinstance(job, AdmJob) else score(job)
    except (FidError, FidInputError, ReferenceBatchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# --- --images / --workdir -----------------------------------------------------------------------
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
    _add_pr_arithmetic(parser)
    parser.set_defaults(mode="images")
    parser.add_argument(
        "--allow_unpinned_weights",
        action="store_true",
        help="accept weights not converted from the pinned standard file (tests; FID then not comparable)",
    )
    return parser.parse_args(argv)


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


if __name__ == "__main__":
    sys.exit(main())
