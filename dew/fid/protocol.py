"""The ``--preset`` mode of ``python -m dew.fid`` (flags read and checked by
``dew.fid.cli.protocol_args``; ``protocol_run`` turns them into ``ProtocolRun``): ``protocol``,
the EDM paper's draw (``dew.scoring.fid_protocol``) reporting FID or ADM's suite.

``protocol`` is one road for both metrics: the preset, the run, its sampler and resolution, the
reference checked against them, the detector, the ``Draw`` and its ``Tally`` (``FidTally``: the
pool sums in ``fid-progress.npz``; ADM's suite: ``dew.scoring.adm_progress.AdmTally``, the pool
and spatial sums and each chunk's pool rows under their digests), a progress file of another
draw or a damaged one refused or set aside before anything is drawn, then ``Draw.run_tally``
(the same chunks, resume and log lines for both) and, when every chunk is in, the report
(``dew.scoring.protocol_results``: the same scores, report and files for both).

ADM's suite: each chunk's images are embedded once (pool_3 and mixed_6/conv[..., :7], the images
at their own size through the TF graph's resize: ``dew.scoring.fid_detector.adm_detector``); at the end
(process 0) the reference batch is embedded where it lacks what a metric needs
(``dew.scoring.adm_metrics.embed_reference``), the metrics are computed (``dew.scoring.protocol_results``) and
written to ``<outdir>/adm.json`` with the reference batch's SHA-256, the samples' statistics to
``<outdir>/adm-stats.npz``. A reference batch of another resolution, a damaged chunk file,
``--image_handling`` other than the graph's own (tf1) and every other bad input is one line and
exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any

from dew.fid.inputs import Weights, load_run


@dataclasses.dataclass(frozen=True)
class ProtocolRun:
    """The ``--preset`` mode's settings, from its checked flags: the run (``workdir``, ``step``,
    ``raw``), the ``preset``, the reference ``ref``, the draw (``num`` images from ``first_seed``,
    ``batch`` per device, ``chunk`` per progress record, ``max_chunks``, ``preview``) resumable in
    ``outdir``, ``distributed``, the ``metrics`` (``("fid",)`` or ADM's suite), the ``weights``
    and ADM's ``pr_arithmetic``."""

    workdir: str
    preset: str
    ref: str
    outdir: str
    metrics: tuple[str, ...]
    weights: Weights
    num: int = 50_000
    first_seed: int = 0
    batch: int = 64
    chunk: int = 1000
    max_chunks: int | None = None
    preview: int = 0
    step: int | None = None
    raw: bool = False
    distributed: bool = False
    pr_arithmetic: str = "float16"


def protocol_run(args: argparse.Namespace) -> ProtocolRun:
    """The ``--preset`` mode's settings from its checked flags (``dew.fid.cli.protocol_args``,
    which parsed ``--metrics``)."""
    return ProtocolRun(
        workdir=args.workdir,
        preset=args.preset,
        ref=args.ref,
        outdir=args.outdir,
        metrics=args.metrics,
        weights=Weights(args.weights, pinned=not args.allow_unpinned_weights, handling=args.image_handling),
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


def protocol(args: argparse.Namespace) -> int:
    """``--preset``: the flags' settings (``protocol_run``), then draw (resuming) and report
    ``--metrics`` (``("fid",)`` or ADM's suite); ``FidError`` / ``FidInputError`` on bad input,
    before anything is written."""
    from dew.objectives.protocol_presets import resolve
    from dew.scoring import fid_protocol as fp
    from dew.scoring.adm_metrics import LABELS, protocol_scorer, reference_batch
    from dew.scoring.adm_progress import AdmTally
    from dew.scoring.fid_detector import protocol_detector
    from dew.scoring.fid_reference import load_reference
    from dew.scoring.inception import FEATURE_DIM

    run = protocol_run(args)
    metrics, handling = run.metrics, run.weights.handling
    adm = metrics != ("fid",)
    # the reference read and checked before the run: a bad one costs no load
    reference = reference_batch(run.ref, metrics) if adm else load_reference(run.ref, dim=FEATURE_DIM)
    if run.distributed:
        import jax

        jax.distributed.initialize()
    task, resolution = load_run(run.workdir, run.step, run.raw)
    sampler = resolve(run.preset, task.objective)
    fp.model_classes(task.objective)
    weights = run.weights
    scorer: Any = None
    if adm:
        scorer, detector = protocol_scorer(
            reference,
            run.ref,
            resolution,
            weights.path,
            pinned=weights.pinned,
            batch=run.batch,
            flag=weights.flag,
        )
    else:
        detector = protocol_detector(
            reference, run.ref, resolution, weights.path, pinned=weights.pinned, handling=handling
        )
    flags = {k: getattr(run, k) for k in ("num", "outdir", "first_seed", "batch", "chunk", "preview")}
    identity = {"workdir": os.path.abspath(run.workdir), "step": task.step, "raw": bool(run.raw)}
    draw = fp.Draw(task.objective, task.params, sampler, detector, identity=identity, **flags)

    def new_tally() -> fp.Tally:
        return AdmTally(run.num, run.chunk) if adm else fp.FidTally(detector.dim)

    if os.path.isdir(run.outdir):  # refuse a bad or other draw's progress now
        new_tally().resume(run.outdir, draw.settings())
    os.makedirs(run.outdir, exist_ok=True)
    tally = new_tally()
    if not draw.run_tally(tally, max_chunks=run.max_chunks):
        return 0
    import jax

    from dew.scoring.protocol_results import conclude

    if adm and jax.process_index() != 0:
        return 0  # process 0 reports (the metrics read every chunk file it wrote)
    report = conclude(
        metrics,
        tally,
        draw,
        reference,
        run.ref,
        resolution,
        scorer=scorer,
        arithmetic=run.pr_arithmetic,
        write=jax.process_index() == 0,
    )
    print(json.dumps(report, indent=1))
    for name in metrics:  # FID's protocol prints its line as fid.py does
        print(f"FID {report[name]!r}" if not adm else f"{LABELS[name]}: {report[name]!r}")
    return 0


__all__ = ["ProtocolRun", "protocol", "protocol_run"]
