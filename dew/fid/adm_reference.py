"""ADM's reference batch as ``python -m dew.fid`` takes it, for its suite on images or a run
(``dew.fid.score.adm_suite``) and in the protocol (``dew.fid.protocol.protocol``): ``--ref`` read
and checked against the samples (``reference_batch``), embedded where it lacks what a metric needs
(``embed_reference``), and the scorer (and the protocol's detector) over the Inception weights.

``--ref`` is ADM's reference-batch ``.npz`` (openai/guided-diffusion ``evaluations/evaluator.py``:
``arr_0`` images and/or ``mu``, ``sigma``, ``mu_s``, ``sigma_s``; its stored statistics are used
when present, as the evaluator does; precision and recall embed ``arr_0``, or read dew's
``pool``) or a folder of images. A reference of another resolution than the samples, and every
other bad input, is a ``FidError`` (one line, exit 2).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dew.fid.inputs import FidError, Samples, Weights, list_images, read_batches


def adm_scorer(weights: Weights, batch: int) -> Any:
    """ADM's scorer (``dew.scoring.adm_metrics.AdmScorer``); ``FidError`` naming the weights."""
    from dew.scoring.adm_metrics import AdmScorer

    try:
        return AdmScorer(weights.path, pinned=weights.pinned, batch=batch)
    except (OSError, ValueError) as e:
        raise FidError(f"{weights.flag}: {e}") from None


def reference_batch(ref: str, metrics: tuple[str, ...], resolution: tuple[int, int]) -> dict[str, Any]:
    """``--ref``: an ADM reference batch (``read_reference_batch``) or a folder of images, read
    (not yet embedded), holding what ``metrics`` need and checked against the samples'
    ``resolution``; ``FidError`` in one line otherwise."""
    from dew.scoring.adm_evaluator import NHOOD_SIZES

    if os.path.isdir(ref):
        files = list_images(ref, "--ref")
        ref_resolution = Samples(len(files), "", batch_size=1, files=files).resolution()
        out: dict[str, Any] = {"files": files, "resolution": ref_resolution, "num_images": len(files)}
    else:
        from dew.scoring.adm_evaluator import ReferenceBatchError, read_reference_batch

        try:
            out = read_reference_batch(ref)
        except ReferenceBatchError as e:
            raise FidError(str(e)) from None
        needs_rows = {"precision", "recall"} & set(metrics)
        has_stats = all(k in out for k in ("mu", "sigma", "mu_s", "sigma_s"))
        if needs_rows and "images" not in out and "pool" not in out:
            raise FidError(f"--ref={ref!r} holds statistics only; precision and recall need its arr_0 images")
        if not has_stats and "images" not in out and "pool" not in out:
            raise FidError(f"--ref={ref!r} holds neither statistics nor images")
        if not has_stats and "images" not in out and {"fid", "sfid"} & set(metrics):
            raise FidError(
                f"--ref={ref!r} holds pool rows only; fid and sfid need its mu, sigma, mu_s, sigma_s "
                "or its arr_0 images"
            )
    needs_rows = {"precision", "recall"} & set(metrics)
    rows = out.get("num_images") if ("images" in out or "pool" in out or "files" in out) else None
    if needs_rows and rows is not None and rows < max(NHOOD_SIZES) + 1:  # each point, k neighbours
        raise FidError(
            f"--ref={ref!r} holds {rows} images; precision and recall need at least "
            f"{max(NHOOD_SIZES) + 1} (each image's {max(NHOOD_SIZES)} nearest neighbours)"
        )
    recorded = out.get("resolution")
    if recorded is not None and tuple(recorded) != tuple(resolution):
        raise FidError(
            f"--ref={ref!r} is a reference batch at {recorded[0]}x{recorded[1]}, the samples are "
            f"{resolution[0]}x{resolution[1]}; ADM's metrics compare images of one resolution"
        )
    return out


def embed_reference(
    reference: dict[str, Any], scorer: Any, metrics: tuple[str, ...], batch: int
) -> dict[str, Any]:
    """mu/sigma/mu_s/sigma_s (stored ones first, as the evaluator's ``read_statistics``) and the
    pool rows precision and recall need (stored ``pool``, else ``arr_0`` or the folder embedded)."""
    from dew.scoring import adm_metrics

    stored = {k: reference[k] for k in ("mu", "sigma", "mu_s", "sigma_s") if k in reference}
    needs_rows = bool({"precision", "recall"} & set(metrics))
    out: dict[str, Any] = {}
    if len(stored) == 4 and (not needs_rows or "pool" in reference):
        out.update(stored)
        if "pool" in reference:
            out["pool"] = reference["pool"]
        return out
    features = adm_metrics.AdmFeatures(scorer, softmax=False)
    if "files" in reference:
        features.add_all(_image_batches(reference["files"], batch))
    elif "images" in reference:
        features.add_all(reference["images"].batches(batch))
    else:  # stored statistics and pool rows
        out.update(stored, pool=reference["pool"])
        return out
    out.update(features.statistics())
    out.update(stored)  # the batch's own statistics win, as in the evaluator
    out["pool"] = features.pool
    return out


def _image_batches(files: list[str], batch: int) -> Iterator[np.ndarray]:
    from dew.scoring.adm_metrics import quantize

    for images in read_batches(files, batch):
        yield quantize(images, (0.0, 1.0))


def scorer_and_detector(weights: Weights, batch: int) -> tuple[Any, Any]:
    """ADM's scorer (the reference's embedding, the Inception Score's classifier) and the
    protocol's detector over the same weights, read once; ``FidError`` naming the weights
    otherwise."""
    from dew.scoring.adm_progress import adm_detector

    scorer = adm_scorer(weights, batch)
    return scorer, adm_detector(scorer.params, scorer.digest)


__all__ = ["adm_scorer", "embed_reference", "reference_batch", "scorer_and_detector"]
