"""Each ``python -m dew.fid`` mode's flags (parsed by ``dew.fid.cli``, which records the mode)
checked before any work and turned, once, into what its function takes (``settings_of``, by
mode): ``check`` → ``dew.fid.score.ScoreJob``, ``check_adm`` → ``dew.fid.score.AdmJob``, each
holding its ``samples`` → ``dew.fid.inputs.Samples`` (the folder listed or the run loaded, last),
``protocol_run`` → ``dew.fid.protocol.ProtocolRun``, ``reference_job`` →
``dew.fid.protocol.ReferenceJob``. A bad flag, or a file it names that cannot be read, is a
``FidError`` naming the flag; flags are checked before the files they name are read."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from dew.fid.inputs import DEFAULT_NUM_SAMPLES, FidError, Samples, Weights, list_images, load_pipeline

if TYPE_CHECKING:
    from dew.fid.protocol import ProtocolRun, ReferenceJob
    from dew.fid.score import AdmJob, ScoreJob


def settings_of(args: argparse.Namespace) -> ReferenceJob | ProtocolRun | ScoreJob | AdmJob:
    """The settings of the mode ``args`` were parsed for (``args.mode``: ``"ref"``, ``"preset"``,
    or ``"images"``: ``--images`` or ``--workdir`` without ``--preset``, ADM's suite when
    ``--metrics`` names one of its own); ``FidError`` naming the flag otherwise."""
    if args.mode == "ref":
        return reference_job(args)
    if args.mode == "preset":
        return protocol_run(args)
    return check_adm(args) if wants_adm(args.metrics) else check(args)


def wants_adm(metrics: str) -> bool:
    """``--metrics`` names one of ADM's own metrics (sFID, IS, precision, recall)."""
    from dew.scoring.adm_metrics import ADM_ONLY

    return any(name.strip() in ADM_ONLY for name in metrics.split(","))


def check(args: argparse.Namespace) -> ScoreJob:
    """The ``fid`` / ``fd_dinov2`` / KID mode's flags, checked before any work, then the files they
    name read or checked (``--dinov2_ref``, ``--ref``, ``--images``, the Inception weights);
    ``FidError`` naming the flag otherwise. Returns the mode's settings: the parsed metrics, the
    reference statistics read by metric name and a folder ``--ref``'s files."""
    from dew.fid.score import ScoreJob
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
    check_run_flags(args)
    references, ref_images = _read_references(args, bool(wants_dinov2 and args.dinov2_ref), "fid" in metrics)
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


def check_run_flags(args: argparse.Namespace) -> None:
    """The ``--workdir`` flags: absent without it, ``--num_samples`` >= 2 with it (default 10000)."""
    if not args.workdir:
        given = [f"--{k}" for k in ("step", "num_samples", "seed") if getattr(args, k) is not None]
        if given or args.raw:
            raise FidError(f"{', '.join(given + ['--raw'] * args.raw)} only apply with --workdir=<run>")
        return
    if args.num_samples is None:
        args.num_samples = DEFAULT_NUM_SAMPLES
    if args.num_samples < 2:
        raise FidError(f"--num_samples={args.num_samples}: need at least 2 samples")


def _read_references(
    args: argparse.Namespace, dinov2_ref: bool, fid: bool
) -> tuple[dict[str, Any], Samples | None]:
    """The statistics files the flags name, read by metric name (``--dinov2_ref`` when
    ``dinov2_ref``; with ``fid`` a file ``--ref``, with features for ``--kid``), and a folder
    ``--ref``'s images listed (``Samples`` read ``--batch_size`` at a time; None for a file or
    none). The folders are listed first
    (``--images``, a folder ``--ref``), then the files read, then (with ``fid``) the Inception
    weights checked present. ``FidError`` naming the flag otherwise."""
    from dew.npz import NotAnNpzError, open_npz
    from dew.scoring.convert_inception import HOW_TO_GET, default_path
    from dew.scoring.statistics import load_statistics

    ref_folder = bool(args.ref) and os.path.isdir(args.ref)
    if args.images:
        list_images(args.images, "--images")
    ref_images = None
    if ref_folder:
        files = list_images(args.ref, "--ref")
        ref_images = Samples(len(files), f"images in {args.ref}", args.batch_size, files=files)
    named = {
        "fd_dinov2": ("--dinov2_ref", args.dinov2_ref if dinov2_ref else None),
        "fid": ("--ref", args.ref if fid and not ref_folder else None),
    }
    out = {}
    for metric, (flag, path) in named.items():
        if path:
            try:
                out[metric] = load_statistics(path)
            except (OSError, ValueError) as e:
                raise FidError(f"{flag}: {e}") from None
    if args.kid and "features" not in out.get("fid", {"features": None}):
        raise FidError(f"--ref={args.ref!r} holds no 'features' for --kid (save them with --keep_features)")
    if not fid:
        return out, ref_images
    weights = os.path.expanduser(args.weights) if args.weights else default_path()
    if not os.path.isfile(weights):
        raise FidError(f"FID Inception weights not found at {weights}: {HOW_TO_GET}")
    flag = "--weights" if args.weights else "the FID Inception weights"
    try:
        with open_npz(weights, flag) as data:
            data.files  # noqa: B018  the archive's directory is read: a zip, not just named .npz
    except NotAnNpzError as e:
        raise FidError(f"{e}; convert them with python -m dew.scoring.convert_inception") from None
    return out, ref_images


def samples(args: argparse.Namespace) -> Samples:
    """The images ``--images`` or ``--workdir`` names (flags checked): the folder's files, or the
    run's pipeline loaded (``load_pipeline``) with the first draw's seed; ``FidError`` naming the
    flag otherwise."""
    if args.images:
        files = list_images(args.images, "--images")
        return Samples(len(files), f"images in {args.images}", args.batch_size, files=files)
    task = load_pipeline(args.workdir, args.step, args.raw)
    seed = task.options["seed"] if args.seed is None else args.seed
    what = f"samples from {task!r}, seed {seed}"
    return Samples(args.num_samples, what, args.batch_size, task=task, seed=seed)


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


def check_adm(args: argparse.Namespace) -> AdmJob:
    """ADM's suite's flags, checked; its settings (the parsed metrics among them), or
    ``FidError`` naming the flag."""
    from dew.fid.score import AdmJob

    metrics = parse_suite(args.metrics)
    other = [
        f"--{f}"
        for f in ("save_stats", "dinov2_weights", "dinov2_ref", "save_dinov2_stats")
        if getattr(args, f)
    ]
    other += ["--kid"] * bool(args.kid) + ["--keep_features"] * bool(args.keep_features)
    if other:
        raise FidError(f"{', '.join(other)} do not apply to ADM's suite (--metrics={','.join(metrics)})")
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
    check_run_flags(args)
    return AdmJob(
        samples=samples(args),
        metrics=metrics,
        ref=args.ref,
        save_ref_batch=args.save_ref_batch,
        weights=Weights(args.weights, pinned=not args.allow_unpinned_weights),
        batch_size=args.batch_size,
        pr_arithmetic=args.pr_arithmetic,
    )


def protocol_run(args: argparse.Namespace) -> ProtocolRun:
    """The ``--preset`` mode's settings from its checked flags (``protocol_args``), ``--metrics``
    parsed (``protocol_metrics``)."""
    from dew.fid.protocol import ProtocolRun

    return ProtocolRun(
        workdir=args.workdir,
        preset=args.preset,
        ref=args.ref,
        outdir=args.outdir,
        metrics=protocol_metrics(args.metrics),
        weights=weights_of(args),
        num=args.num,
        first_seed=args.first_seed,
        batch=args.batch,
        chunk=args.chunk,
        max_chunks=args.max_chunks,
        preview=args.preview,
        step=args.step,
        raw=args.raw,
        distributed=args.distributed,
        pr_arithmetic=args.pr_arithmetic,
    )


def protocol_metrics(text: str) -> tuple[str, ...]:
    """``("fid",)`` (the EDM protocol's FID) or ADM's suite (``parse_suite``); ``FidError`` for
    anything else."""
    if wants_adm(text):
        return parse_suite(text)
    if text.strip() != "fid":
        raise FidError(
            f"--metrics={text!r} is invalid with --preset: expected fid, or ADM's suite (a subset of "
            "fid,sfid,is,precision,recall with at least one of sfid, is, precision, recall)"
        )
    return ("fid",)


def reference_job(args: argparse.Namespace) -> ReferenceJob:
    """The ``ref`` mode's settings from its checked flags (``ref_args``)."""
    from dew.fid.protocol import ReferenceJob

    return ReferenceJob(data=args.data, dest=args.dest, batch=args.batch, weights=weights_of(args))


def weights_of(args: argparse.Namespace) -> Weights:
    """``--weights``, ``--allow_unpinned_weights`` and ``--image_handling`` as one ``Weights``."""
    return Weights(args.weights, pinned=not args.allow_unpinned_weights, handling=args.image_handling)
