"""A finished protocol draw's numbers and the files that record them, for FID and ADM's suite
alike (``dew.scoring.fid_protocol`` with a ``dew.scoring.fid_progress.Tally``).

``scores`` reads the samples as one ``dew.scoring.feature_set.FeatureSet``: their statistics
from the tally's float64 sums (μ = Σf/n, Σ = (Σffᵀ − nμμᵀ)/(n − 1), as ``MomentSums``), their
pool rows from the chunk files (each checked against the digest its progress file records) and
their softmax rows from those pool rows (``softmax(pool · Wᵀ)`` chunk by chunk:
``probabilities``), and the reference's ``mu``, ``sigma`` (and ``mu_s``, ``sigma_s``, pool rows)
as the caller read or embedded them; the metrics follow the evaluator's rules
(``dew.scoring.feature_set.score_sets``). Every number is a function of the progress file and its
chunk files alone, so a draw interrupted and rerun reports what one never interrupted does, bit
for bit.

``report`` is the numbers with every input they depend on (images, seeds, sampler, model,
detector, the reference's path, SHA-256 and, where it records them, resolution, count and
detector); ``write_results`` writes it as the layout's report (``fid.json``, ``adm.json``) and
the samples' statistics (``fid-stats.npz``, ``adm-stats.npz``: ``mu``, ``sigma`` (``mu_s``,
``sigma_s``) and dew's provenance, the layout ``load_reference`` and ``read_reference_batch``
read), each atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dew.scoring.fid_progress import Tally


def scores(
    metrics: Sequence[str],
    tally: Tally,
    outdir: str,
    reference: dict[str, Any],
    probabilities: Callable[[np.ndarray], np.ndarray] | None = None,
    arithmetic: str = "float16",
) -> dict[str, float]:
    """The requested metrics of a complete draw in ``outdir`` against ``reference``, in the
    order asked; ``probabilities`` maps pool rows [n, 2048] to softmax rows [n, 1008]
    (``AdmScorer.probabilities``; the Inception Score's); precision and recall's distances in
    ``arithmetic``. ``FidInputError`` when a chunk file is not what the progress file recorded."""
    from dew.scoring.feature_set import FeatureSet, score_sets

    rows: list[list[np.ndarray]] = []

    def chunks() -> list[np.ndarray]:
        if not rows:
            rows.append(tally.pool_rows(outdir))
        return rows[0]

    def softmax() -> np.ndarray:
        assert probabilities is not None, "the Inception Score needs the classifier"
        return np.concatenate([probabilities(part) for part in chunks()])

    samples = FeatureSet.of_adm(tally.statistics(), lambda: np.concatenate(chunks()), softmax)
    return score_sets(metrics, samples, FeatureSet.of_adm(reference), arithmetic)


def report(
    scores: dict[str, float], draw: Any, reference: dict[str, Any], ref_path: str, ref_digest: str
) -> dict[str, Any]:
    """The metrics (in the order asked) and every input they depend on; ``draw`` is the
    protocol's ``Draw``."""
    recorded = {k: reference[k] for k in ("resolution", "num_images", "detector") if k in reference}
    if "resolution" in recorded:
        recorded["resolution"] = [int(v) for v in recorded["resolution"]]
    if "num_images" in recorded:
        recorded["num_images"] = int(recorded["num_images"])
    return {
        **{name: float(value) for name, value in scores.items()},
        "num_images": draw.num,
        "seeds": [draw.first_seed, draw.first_seed + draw.num - 1],
        "sampler": draw.sampler.settings(),
        "model": draw.identity,
        "detector": draw.detector.description,
        "reference": {"path": os.path.abspath(ref_path), "sha256": ref_digest, **recorded},
    }


def write_results(outdir: str, tally: Tally, report: dict[str, Any], resolution: tuple[int, int]) -> None:
    """The layout's statistics file (the samples' statistics in the reference layout) and its
    report file, each written to a temporary file and renamed into place."""
    arrays: dict[str, np.ndarray | np.generic] = {
        k: np.asarray(v, np.float64) for k, v in tally.statistics().items()
    }
    arrays["resolution"] = np.asarray(resolution, np.int64)
    arrays["num_images"] = np.int64(tally.count)
    arrays["detector"] = np.str_(report["detector"])
    path = os.path.join(outdir, tally.layout.stats)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays, allow_pickle=False)
    os.replace(tmp, path)
    path = os.path.join(outdir, tally.layout.report)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)


def conclude(
    metrics: Sequence[str],
    tally: Tally,
    draw: Any,
    reference: dict[str, Any],
    ref_path: str,
    resolution: tuple[int, int],
    *,
    scorer: Any = None,
    arithmetic: str = "float16",
    write: bool = True,
) -> dict[str, Any]:
    """A complete ``draw``'s report (``report``) of ``metrics`` against the reference read from
    ``ref_path``: with ADM's ``scorer`` (``AdmScorer``) the reference batch is embedded where a
    metric needs it (``adm_metrics.embed_reference``, ``draw.batch`` images at a time) and the
    Inception Score's softmax rows come from its classifier; the scores (``scores``), the
    reference file's SHA-256, and with ``write`` the layout's files in ``draw.outdir``
    (``write_results``, the samples at ``resolution``). ``FidInputError`` when a chunk file is
    not what the progress file recorded."""
    from dew.scoring.adm_metrics import embed_reference
    from dew.scoring.convert_inception import file_sha256

    embedded, probabilities = reference, None
    if scorer is not None:
        embedded = embed_reference(reference, scorer, metrics, draw.batch)
        probabilities = scorer.probabilities
    numbers = scores(metrics, tally, draw.outdir, embedded, probabilities, arithmetic)
    out = report(numbers, draw, reference, ref_path, file_sha256(ref_path))
    if write:
        write_results(draw.outdir, tally, out, resolution)
    return out


__all__ = ["conclude", "report", "scores", "write_results"]
