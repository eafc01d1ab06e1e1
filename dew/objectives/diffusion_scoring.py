"""Scoring a diffusion model's image preview with registered metrics: a pure function of the
preview, the metrics and what the objective says about its samples (their shape, the classes the
preview's rows were asked for, how many of them were non-finite).

``PreviewRecord`` is the one thing a preview leaves for its scoring: the count of non-finite
samples, which the artifact cannot carry (it shows them grey). The objective builds one record
in its constructor and never replaces it; its preview writes the count, its ``score`` reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from dew.schema import ConfigError


@dataclasses.dataclass
class PreviewRecord:
    """What the last preview drawn left for its scoring: ``nonfinite`` samples (rows with a NaN
    or an inf before they were drawn grey or saturated)."""

    nonfinite: int = 0


def preview_scores(
    preview: Any,
    metrics: Mapping[str, Callable[..., float]],
    *,
    sample_shape: tuple[int, ...],
    num_classes: int | None,
    per_class: int,
    nonfinite: int,
) -> dict[str, float]:
    """``metric(images, labels)`` for each named metric on an image preview of ``per_class`` rows
    per class, class-major (``num_classes`` None or 0: one unlabelled class), the labels being the
    classes the rows were asked for. Samples of ``sample_shape`` that are not images [H, W, C] are
    refused with a ``ConfigError``; ``preview`` None only checks that (the Trainer, before
    training); with ``nonfinite`` samples no metric is asked (classifiers refuse NaN) and
    ``nonfinite_samples`` is reported instead."""
    if not metrics:
        return {}
    if not sample_shape or len(sample_shape) != 3:
        raise ConfigError(
            f"config.preview.metrics={tuple(metrics)!r} is invalid: previews of "
            f"{sample_shape}-shaped samples are not images; expected ()"
        )
    if preview is None:
        return {}
    if nonfinite:
        if jax.process_index() == 0:
            print(
                f"preview: {nonfinite} of {len(preview.images)} samples are non-finite; "
                f"{', '.join(metrics)} not scored",
                flush=True,
            )
        return {"nonfinite_samples": float(nonfinite)}
    labels = np.repeat(np.arange(num_classes or 1), per_class)
    return {name: float(metric(preview.images, labels)) for name, metric in metrics.items()}


__all__ = ["PreviewRecord", "preview_scores"]
