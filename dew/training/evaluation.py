"""Evaluation events (``Evaluation``) and finite coordinated evaluation (``evaluate``).

``evaluate`` is the whole of evaluation without a trainer: a state, a pure eval function, a
finite prefix of batches. It touches no optimizer and no tracker, so a user can call it on a
restored checkpoint. With several processes each reads its own share of the prefix; they agree
first on how many batches all of them have, so every process runs the same number of collective
eval steps (a process that ran one more would wait forever for the others).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

from dew.artifacts import ImageGrid
from dew.tracking.trackers import LoggingCategory, Tracker

Batch = Mapping[str, Any]

#: Default bounds on the previews one evaluation event hosts.
MAX_PREVIEW_IMAGES = 256
MAX_PREVIEW_BYTES = 16 * 2**20


def agreed_count(local: int) -> int:
    """The smallest of every process's ``local`` count (``local`` itself on one process)."""
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    counts = multihost_utils.process_allgather(np.asarray(local, np.int32))
    return int(np.min(counts))


def evaluate(
    eval_fn: Callable[[Any, Batch, jax.Array], Mapping[str, jax.Array]],
    state: Any,
    batches: Iterable[Batch],
    num_batches: int,
    rng: jax.Array,
    *,
    place_batch: Callable[[Batch], Batch] | None = None,
) -> dict[str, float]:
    """Evaluate a finite coordinated prefix without an optimizer or tracker.

    Takes at most ``num_batches`` batches from ``batches`` (which may be endless), agrees with
    the other processes on the number all of them got, and returns each statistic's mean over
    those batches (equal weight per batch) plus ``"num_batches"``. Batch ``i`` gets the key
    ``fold_in(rng, i)``: a fixed ``rng`` makes successive evaluations comparable. ``place_batch``
    puts a host batch on the mesh (``Layout.place_batch``); without it batches go to jit as-is.
    Raises if no process has a batch to evaluate.
    """
    if num_batches < 1:
        raise ValueError(f"evaluate: num_batches must be >= 1, got {num_batches}")
    from dew.runtime import platform

    platform.start_for("evaluate", say=False, present_devices=False, detect_processes=False)
    prefix = list(itertools.islice(iter(batches), num_batches))
    count = agreed_count(len(prefix))
    if count == 0:
        raise ValueError("evaluate: the evaluation data is empty (on at least one process)")
    per_batch: list[Mapping[str, jax.Array]] = []
    for i, batch in enumerate(prefix[:count]):
        placed = place_batch(batch) if place_batch is not None else batch
        per_batch.append(eval_fn(state, placed, jax.random.fold_in(rng, i)))
    per_batch = jax.device_get(per_batch)  # one transfer for the whole prefix
    means = {k: float(np.mean([np.asarray(s[k]) for s in per_batch])) for k in per_batch[0]}
    return {**means, "num_batches": count}


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Holds one evaluation event, with bounded hosted previews on rank zero.

    ``metrics`` are the event's scalars (the same on every process). ``previews`` are artifacts
    (``dew.artifacts``; image grids are bounded, others kept as they are) hosted only on
    process 0 (elsewhere the mapping is empty: previews are for people, and
    one copy is enough), capped by ``hosted`` at ``max_images`` images per grid and ``max_bytes``
    over the event, so an evaluation can never flood a tracker or the disk. ``dropped`` counts
    the images the caps left out.
    """

    step: int
    metrics: Mapping[str, float]
    previews: Mapping[str, Any] = dataclasses.field(default_factory=dict[str, Any])
    dropped: int = 0

    @classmethod
    def hosted(
        cls,
        step: int,
        metrics: Mapping[str, float],
        previews: Mapping[str, Any] | None = None,
        *,
        max_images: int = MAX_PREVIEW_IMAGES,
        max_bytes: int = MAX_PREVIEW_BYTES,
    ) -> Evaluation:
        """The event as this process holds it: previews bounded, and only on rank zero."""
        if max_images < 1 or max_bytes < 1:
            raise ValueError(
                f"Evaluation: max_images and max_bytes must be >= 1, got {max_images}, {max_bytes}"
            )
        kept: dict[str, Any] = {}
        dropped, budget = 0, max_bytes
        if jax.process_index() == 0:
            for name, grid in (previews or {}).items():
                if not isinstance(grid, ImageGrid):  # other artifacts are hosted as they are
                    kept[name] = grid
                    continue
                images = grid.images
                per_image = images[0].nbytes if len(images) else 0
                n = min(len(images), max_images, budget // per_image if per_image else 0)
                dropped += len(images) - n
                if n:
                    captions = None if grid.captions is None else grid.captions[:n]
                    kept[name] = ImageGrid(images[:n], captions=captions, columns=grid.columns)
                    budget -= n * per_image
        return cls(int(step), {k: float(v) for k, v in metrics.items()}, kept, dropped)

    def log(self, tracker: Tracker, category: LoggingCategory = LoggingCategory.EVAL_METRICS) -> None:
        """Send the scalars and the hosted previews to ``tracker``."""
        if self.metrics:
            tracker.log(category, dict(self.metrics), self.step)
        for name, grid in self.previews.items():
            tracker.log_artifact(name, grid, self.step)
