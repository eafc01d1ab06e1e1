"""The diffusion objective's scoring side: registered metrics on an image preview, for
``dew.objectives.diffusion.Diffusion`` (it reads the objective's ``input_spec``, ``sampling``,
``num_classes`` and the non-finite count its last preview left)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from dew.schema import ConfigError


class DiffusionScoring:
    """Scoring of a diffusion objective's previews (see the module docstring)."""

    def score(self, preview: Any, metrics: Mapping[str, Callable[..., float]]) -> dict[str, float]:
        """``metric(images, labels)`` for each named metric on an image preview, the labels being
        the classes the rows were asked for; when the last preview held non-finite samples, no
        metric is asked (classifiers refuse NaN) and ``nonfinite_samples`` is reported instead."""
        if not metrics:
            return {}
        if not self.input_spec.sample.shape or len(self.input_spec.sample.shape) != 3:
            raise ConfigError(
                f"config.preview.metrics={tuple(metrics)!r} is invalid: previews of "
                f"{self.input_spec.sample.shape}-shaped samples are not images; expected ()"
            )
        if preview is None:
            return {}
        if self.nonfinite_samples:
            if jax.process_index() == 0:
                print(
                    f"preview: {self.nonfinite_samples} of {len(preview.images)} samples are non-finite; "
                    f"{', '.join(metrics)} not scored",
                    flush=True,
                )
            return {"nonfinite_samples": float(self.nonfinite_samples)}
        labels = np.repeat(np.arange(self.num_classes or 1), self.sampling.per_class)
        return {name: float(metric(preview.images, labels)) for name, metric in metrics.items()}
