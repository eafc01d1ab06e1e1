"""The protocol modes of ``python -m dew.fid`` (flags read and checked by ``dew.fid.cli``):
``protocol`` (``--preset``: the EDM paper's draw, ``dew.scoring.fid_protocol``, reporting FID or
ADM's suite) and ``reference`` (``ref``: a data set's statistics as NVlabs/edm's ``fid.py ref``,
``dew.scoring.fid_reference``).

``protocol`` is one road for both metrics: the preset, the run, its sampler and resolution, the
reference checked against them, the detector, the ``Draw`` and its ``Tally`` (``FidTally``: the
pool sums in ``fid-progress.npz``; ADM's suite: ``dew.scoring.adm_progress.AdmTally``, the pool
and spatial sums and each chunk's pool rows under their digests), a progress file of another
draw or a damaged one refused or set aside before anything is drawn, then ``Draw.run_tally``
(the same chunks, resume and log lines for both) and, when every chunk is in, the report
(``dew.scoring.protocol_results``: the same scores, report and files for both).

ADM's suite: each chunk's images are embedded once (pool_3 and mixed_6/conv[..., :7], the images
at their own size through the TF graph's resize: ``adm_progress.adm_detector``); at the end
(process 0) the reference batch is embedded where it lacks what a metric needs
(``dew.fid.score.embed_reference``), the metrics are computed (``dew.scoring.protocol_results``) and
written to ``<outdir>/adm.json`` with the reference batch's SHA-256, the samples' statistics to
``<outdir>/adm-stats.npz``. A reference batch of another resolution, a damaged chunk file,
``--image_handling`` other than the graph's own (tf1) and every other bad input is one line and
exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from dew.fid.inputs import FidError, load_pipeline


def protocol(args: argparse.Namespace, metrics: tuple[str, ...]) -> int:
    """``--preset``: draw (resuming), then report ``metrics`` (``("fid",)`` or ADM's suite);
    ``FidError`` / ``FidInputError`` on bad input, before anything is written."""
    from dew.objectives.protocol_presets import preset_named, resolve
    from dew.scoring import fid_protocol as fp
    from dew.scoring.adm_metrics import LABELS
    from dew.scoring.adm_progress import AdmTally
    from dew.scoring.fid_reference import check_reference, load_reference
    from dew.scoring.inception import FEATURE_DIM

    adm = metrics != ("fid",)
    if adm and args.image_handling != "tf1":
        raise FidError(
            f"--image_handling={args.image_handling} does not apply to ADM's suite: its evaluator "
            "feeds the TF graph its own way (tf1)"
        )
    preset_named(args.preset)  # an unknown name before the run loads
    if adm and os.path.isdir(args.ref):
        raise FidError(f"--ref={args.ref!r} is a folder; the protocol takes an ADM reference batch .npz")
    reference: dict[str, Any] = {} if adm else load_reference(args.ref, dim=FEATURE_DIM)  # before the run
    if args.distributed:
        import jax

        jax.distributed.initialize()
    task = load_pipeline(argparse.Namespace(workdir=args.workdir, step=args.step, raw=args.raw))
    sampler = resolve(args.preset, task.objective)
    shape = getattr(task.objective, "image_shape", None) or task.objective.input_spec.sample.shape
    resolution = (int(shape[0]), int(shape[1]))
    fp.model_classes(task.objective)
    scorer: Any = None
    if adm:
        from dew.fid.score import reference_batch

        reference = reference_batch(args.ref, metrics, resolution)
        scorer, detector = scorer_and_detector(args)
    else:
        check_reference(reference, args.ref, resolution, None, args.image_handling)
        detector = _detector(args)
        check_reference(reference, args.ref, resolution, detector.dim)
    flags = {k: getattr(args, k) for k in ("num", "outdir", "first_seed", "batch", "chunk", "preview")}
    identity = {"workdir": os.path.abspath(args.workdir), "step": task.step, "raw": bool(args.raw)}
    draw = fp.Draw(task.objective, task.params, sampler, detector, identity=identity, **flags)

    def new_tally() -> fp.Tally:
        return AdmTally(args.num, args.chunk) if adm else fp.FidTally(detector.dim)

    if os.path.isdir(args.outdir):  # refuse a bad or other draw's progress now
        new_tally().resume(args.outdir, draw.settings())
    os.makedirs(args.outdir, exist_ok=True)
    tally = new_tally()
    if not draw.run_tally(tally, max_chunks=args.max_chunks):
        return 0
    import jax

    from dew.scoring import protocol_results

    if adm and jax.process_index() != 0:
        return 0  # process 0 reports (the metrics read every chunk file it wrote)
    embedded, probabilities = reference, None  # ADM's: the batch embedded where a metric needs it
    if adm:
        from dew.fid.score import embed_reference

        embedded = embed_reference(reference, scorer, metrics, args.batch)
        probabilities = scorer.probabilities
    scores = protocol_results.scores(metrics, tally, args.outdir, embedded, probabilities, args.pr_arithmetic)
    report = protocol_results.report(scores, draw, reference, args.ref, _digest(args.ref))
    if jax.process_index() == 0:
        protocol_results.write_results(args.outdir, tally, report, resolution)
    print(json.dumps(report, indent=1))
    for name in metrics:  # FID's protocol prints its line as fid.py does
        print(f"FID {report[name]!r}" if not adm else f"{LABELS[name]}: {report[name]!r}")
    return 0


def _digest(path: str) -> str:
    from dew.scoring.fid_reference import file_digest

    return file_digest(path)


def _detector(args: argparse.Namespace) -> Any:
    """The FID Inception detector of ``--weights`` at ``--image_handling``; ``FidError`` naming
    the weights otherwise."""
    from dew.scoring.fid_reference import inception_detector

    try:
        return inception_detector(
            args.weights, pinned=not args.allow_unpinned_weights, handling=args.image_handling
        )
    except (OSError, ValueError) as e:
        raise FidError(f"--weights: {e}") from None


def scorer_and_detector(args: argparse.Namespace) -> tuple[Any, Any]:
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


def reference(args: argparse.Namespace) -> int:
    """``ref --data=DIR|ZIP --dest=FILE.npz``: a data set's reference statistics, as NVlabs/edm's
    ``fid.py ref`` computes them; ``FidError`` / ``FidInputError`` on bad input."""
    from dew.scoring.fid_reference import dataset_files, reference_statistics, save_reference

    files = dataset_files(args.data)
    detector = _detector(args)
    sums, resolution = reference_statistics(files, detector, args.batch)
    mu, sigma = sums.mu_sigma()
    save_reference(
        args.dest, mu, sigma, resolution=resolution, num_images=sums.count, detector=detector.description
    )
    print(f"{sums.count} images at {resolution[0]}x{resolution[1]} -> {args.dest}")
    return 0


__all__ = ["protocol", "reference", "scorer_and_detector"]
