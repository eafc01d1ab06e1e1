"""``python -m dew.fid --preset=... --metrics=fid,sfid,is,precision,recall``: the protocol of
``--preset`` (``dew.fid.protocol_cli``: seeds, sampler, sharding, chunks, resume) reporting ADM's
evaluation suite against an ADM reference batch.

    python -m dew.fid --workdir=runs/x --preset=imagenet64 --metrics=fid,sfid,is,precision,recall \\
        --ref=VIRTUAL_imagenet256_labeled.npz --outdir=adm/ [--num=50000] [--max_chunks=K]

Each chunk's images are embedded once (pool_3 and mixed_6/conv[..., :7], the images at their own
size through the TF graph's resize: ``dew.scoring.adm_progress.adm_detector``); the pool and
spatial sums and each chunk's pool rows go into ``<outdir>`` under digests
(``dew.scoring.adm_progress``), so a rerun after an interruption continues and reports the same
numbers as a run never interrupted. At the end (process 0) the reference batch is embedded
where it lacks what a metric needs (``dew.fid.adm_cli.embed_reference``), the metrics are
computed (``dew.scoring.adm_protocol``) and written to ``<outdir>/adm.json`` with the reference
batch's SHA-256, the samples' statistics to ``<outdir>/adm-stats.npz``. A reference batch of
another resolution, a damaged progress or chunk file, ``--image_handling`` other than the
graph's own (tf1) and every other bad input is one line and exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dew.fid.inputs import FidError, load_pipeline


def adm_protocol_main(args: argparse.Namespace, metrics: tuple[str, ...]) -> int:
    """The ADM mode of ``--preset`` (``args`` from ``protocol_cli._protocol_args``, ``metrics``
    parsed); exit 2 with one line on bad input."""
    from dew.fid.adm_cli import embed_reference, reference_batch
    from dew.objectives.protocol_presets import preset_named, resolve
    from dew.scoring import fid_protocol as fp
    from dew.scoring.adm_evaluator import ReferenceBatchError
    from dew.scoring.adm_progress import AdmTally
    from dew.scoring.fid_reference import FidInputError

    try:
        if args.image_handling != "tf1":
            raise FidError(
                f"--image_handling={args.image_handling} does not apply to ADM's suite: its evaluator "
                "feeds the TF graph its own way (tf1)"
            )
        preset_named(args.preset)  # an unknown name before the run loads
        if os.path.isdir(args.ref):
            raise FidError(f"--ref={args.ref!r} is a folder; the protocol takes an ADM reference batch .npz")
        if args.distributed:
            import jax

            jax.distributed.initialize()
        task = load_pipeline(argparse.Namespace(workdir=args.workdir, step=args.step, raw=args.raw))
        sampler = resolve(args.preset, task.objective)
        shape = getattr(task.objective, "image_shape", None) or task.objective.input_spec.sample.shape
        resolution = (int(shape[0]), int(shape[1]))
        fp.model_classes(task.objective)
        reference = reference_batch(args.ref, metrics, resolution)
        scorer, detector = _scorer_and_detector(args)
        flags = {k: getattr(args, k) for k in ("num", "outdir", "first_seed", "batch", "chunk", "preview")}
        identity = {"workdir": os.path.abspath(args.workdir), "step": task.step, "raw": bool(args.raw)}
        draw = fp.Draw(task.objective, task.params, sampler, detector, identity=identity, **flags)
        if os.path.isdir(args.outdir):  # refuse a bad or other draw's progress now
            AdmTally(args.num, args.chunk).resume(args.outdir, draw.settings())
    except (FidError, FidInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.outdir, exist_ok=True)
    tally = AdmTally(args.num, args.chunk)
    if not draw.run_tally(tally, max_chunks=args.max_chunks):
        return 0
    import jax

    if jax.process_index() != 0:
        return 0  # process 0 reports (the metrics read every chunk file it wrote)
    from dew.scoring.adm_metrics import LABELS
    from dew.scoring.adm_protocol import adm_report, adm_scores, write_adm_results
    from dew.scoring.fid_reference import file_digest

    try:
        embedded = embed_reference(reference, scorer, metrics, args.batch)
        scores = adm_scores(metrics, tally, args.outdir, embedded, scorer.probabilities)
    except (FidError, FidInputError, ReferenceBatchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = adm_report(scores, draw, reference, args.ref, file_digest(args.ref))
    write_adm_results(args.outdir, tally, report, resolution)
    print(json.dumps(report, indent=1))
    for name in metrics:
        print(f"{LABELS[name]}: {report[name]!r}")
    return 0


def _scorer_and_detector(args: argparse.Namespace):
    """ADM's scorer (the reference's embedding, the Inception Score's classifier) and the
    protocol's detector over the same weights; ``FidError`` naming the weights otherwise."""
    from dew.npz import open_npz
    from dew.scoring.adm_metrics import AdmScorer
    from dew.scoring.adm_progress import adm_detector
    from dew.scoring.convert_inception import weights_file

    flag = "--weights" if args.weights else "the FID Inception weights"
    try:
        scorer = AdmScorer(args.weights, pinned=not args.allow_unpinned_weights, batch=args.batch)
        with open_npz(weights_file(args.weights), flag) as data:
            digest = str(data["__content_sha256__"])
    except (OSError, ValueError, KeyError) as e:
        raise FidError(f"{flag}: {e}") from None
    return scorer, adm_detector(scorer.params, digest)


__all__ = ["adm_protocol_main"]
