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
at their own size through the TF graph's resize: ``adm_metrics.AdmScorer.protocol_detector``); at the end
(process 0) the reference batch is embedded where it lacks what a metric needs
(``dew.scoring.adm_metrics.embed_reference``), the metrics are computed (``dew.scoring.protocol_results``) and
written to ``<outdir>/adm.json`` with the reference batch's SHA-256, the samples' statistics to
``<outdir>/adm-stats.npz``. A reference batch of another resolution, a damaged chunk file,
``--image_handling`` other than the graph's own (tf1) and every other bad input is one line and
exit 2, nothing written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from dew.fid.inputs import FidError, Weights, image_resolution, load_pipeline


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


@dataclasses.dataclass(frozen=True)
class ReferenceJob:
    """The ``ref`` mode's settings, from its checked flags: the data set ``data`` (a directory or
    ``.zip`` of images), the ``.npz`` to write (``dest``), images per step (``batch``) and the
    ``weights``."""

    data: str
    dest: str
    batch: int
    weights: Weights


def protocol(run: ProtocolRun) -> int:
    """``--preset``: draw (resuming), then report ``run.metrics`` (``("fid",)`` or ADM's suite);
    ``FidError`` / ``FidInputError`` on bad input, before anything is written."""
    from dew.objectives.protocol_presets import preset_named, resolve
    from dew.scoring import fid_protocol as fp
    from dew.scoring.adm_metrics import LABELS, reference_batch
    from dew.scoring.adm_progress import AdmTally
    from dew.scoring.fid_reference import check_reference, load_reference
    from dew.scoring.inception import FEATURE_DIM

    metrics, handling = run.metrics, run.weights.handling
    adm = metrics != ("fid",)
    if adm and handling != "tf1":
        raise FidError(
            f"--image_handling={handling} does not apply to ADM's suite: its evaluator "
            "feeds the TF graph its own way (tf1)"
        )
    preset_named(run.preset)  # an unknown name before the run loads
    if adm and os.path.isdir(run.ref):
        raise FidError(f"--ref={run.ref!r} is a folder; the protocol takes an ADM reference batch .npz")
    reference: dict[str, Any] = {} if adm else load_reference(run.ref, dim=FEATURE_DIM)  # before the run
    if run.distributed:
        import jax

        jax.distributed.initialize()
    task = load_pipeline(run.workdir, run.step, run.raw)
    resolution = image_resolution(task)
    sampler = resolve(run.preset, task.objective)
    fp.model_classes(task.objective)
    scorer: Any = None
    if adm:
        reference = reference_batch(run.ref, metrics, resolution)
        scorer, detector = run.weights.adm_scorer_and_detector(run.batch)
    else:
        check_reference(reference, run.ref, resolution, None, handling)
        detector = run.weights.detector()
        check_reference(reference, run.ref, resolution, detector.dim)
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


def reference(job: ReferenceJob) -> int:
    """``ref --data=DIR|ZIP --dest=FILE.npz``: the reference statistics of the data set
    ``job.data`` embedded ``job.batch`` images at a time, as NVlabs/edm's ``fid.py ref`` computes
    them, written to ``job.dest``; ``FidError`` / ``FidInputError`` on bad input."""
    from dew.scoring.fid_reference import dataset_files, write_reference

    files = dataset_files(job.data)
    detector = job.weights.detector()
    count, resolution = write_reference(files, detector, job.dest, job.batch)
    print(f"{count} images at {resolution[0]}x{resolution[1]} -> {job.dest}")
    return 0


__all__ = ["ProtocolRun", "ReferenceJob", "protocol", "reference"]
