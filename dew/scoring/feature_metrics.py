"""Several feature-space metrics over the same image batches: ``python -m dew.fid --metrics=...``.

``METRICS`` names what ``dew.fid`` can report from one pass over the images: ``fid`` (Fréchet
distance in the FID Inception's pool features, ``inception_metrics.InceptionScorer``) and
``fd_dinov2`` (Fréchet distance in DINOv2 ViT-L/14 CLS features as NVlabs/edm2's
``calculate_metrics.py`` computes them, ``dinov2_metrics.DINOv2Scorer``), their scorers by name
(``scorers``). ``dew.scoring.feature_scorer.statistics_over`` draws each batch once and hands it
to every scorer, so both metrics see exactly the same images (a run's samples are drawn once,
not once per metric); the distances are read from those statistics through
``dew.scoring.feature_set`` (``FeatureSet.of``, ``frechet``).

The DINOv2 weights are a converted ``.npz`` (``dinov2_weights``); its shape (width, depth, patch,
grid) is read from the arrays (``dinov2.config_from_torch_names``: 64 channels per head, as every
DINOv2 backbone has), so the command takes any DINOv2 backbone's file, ViT-L/14 being the one
edm2 scores with.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

METRICS = ("fid", "fd_dinov2")
DEFAULT_METRICS = ("fid",)
LABELS = {"fid": "FID", "fd_dinov2": "FD_DINOv2"}


def parse_metrics(text: str) -> tuple[str, ...]:
    """``"fid,fd_dinov2"`` → ``("fid", "fd_dinov2")`` in the order given; ``ValueError`` (one line
    naming the value and what is accepted) for an unknown, repeated or empty name."""
    names = tuple(n.strip() for n in text.split(","))
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(
            f"--metrics={text!r}: expected a comma-separated subset of {','.join(METRICS)} "
            "without repeats (e.g. --metrics=fid,fd_dinov2)"
        )
    return names


def scorers(
    metrics: Iterable[str], weights: str | None, dinov2_weights: str | None, *, pinned: bool
) -> dict[str, Any]:
    """The scorers of ``metrics`` by name: the FID Inception on ``weights``, DINOv2 on
    ``dinov2_weights`` (None: their default paths; DINOv2's shape read from its arrays), both
    ``pinned`` or not; missing or refused weights raise one line naming the flag."""
    from dew.scoring.dinov2_metrics import DINOv2Scorer
    from dew.scoring.inception_metrics import InceptionScorer

    out: dict[str, Any] = {}
    for name in metrics:
        if name == "fid":
            try:
                out[name] = InceptionScorer(weights_path=weights, pinned=pinned)
            except (OSError, ValueError) as e:  # as dew.scoring.fid_detector.weights_detector says it
                raise ValueError(f"--weights: {e}") from None
            continue
        try:
            out[name] = DINOv2Scorer(weights_path=dinov2_weights, allow_unpinned=not pinned)
        except (OSError, ValueError) as e:
            raise ValueError(f"{'--dinov2_weights' if dinov2_weights else 'FD_DINOv2'}: {e}") from None
    return out


__all__ = [
    "DEFAULT_METRICS",
    "LABELS",
    "METRICS",
    "parse_metrics",
    "scorers",
]
