"""``Retention``: which steps a directory keeps, a pure function of the steps and their metrics.
Two policies cover both APIs: dew's ``Checkpoints(keep=k)`` keeps the newest ``k`` steps,
plus the one step with the lowest metric (``Retention(newest=k, best=1)``; ``keep_best=False``
drops the second part); stix's ``keep_best=True`` keeps the ``max_to_keep`` lowest eval
losses, plus the newest step (``Retention(newest=1, best=max_to_keep)``, so up to
``max_to_keep + 1`` on disk), and with ``keep_best=False`` the newest ``max_to_keep``
(``Retention(newest=max_to_keep, best=0)``). ``newest=None`` keeps everything (no pruning). A
step whose metrics lack the ranked metric (or carry none) is never among the best, but still
counts among the newest, so pruning goes on whatever was saved. Ties rank the earlier step
first: it reached that value first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Retention:
    """Keep the ``newest`` steps (None: all) and the ``best`` steps by lowest ``metric``."""

    newest: int | None
    best: int = 0
    metric: str = "loss"

    def __post_init__(self):
        if self.newest is not None and (not _is_int(self.newest) or self.newest < 0):
            raise ValueError(f"Retention: newest must be None or an int >= 0, got {self.newest!r}")
        if not _is_int(self.best) or self.best < 0:
            raise ValueError(f"Retention: best must be an int >= 0, got {self.best!r}")
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"Retention: metric must be a non-empty string, got {self.metric!r}")

    def ranked(self, metrics: Mapping[int, Mapping[str, float] | None]) -> list[int]:
        """Steps that reported a finite ``metric``, lowest first (ties: earlier step first)."""
        scored = [
            (float(m[self.metric]), step)
            for step, m in metrics.items()
            if m is not None and self.metric in m and math.isfinite(float(m[self.metric]))
        ]
        return [step for _, step in sorted(scored)]

    def best_step(self, metrics: Mapping[int, Mapping[str, float] | None]) -> int | None:
        """The step with the lowest ``metric``, or None when no step reported it."""
        ranked = self.ranked(metrics)
        return ranked[0] if ranked else None

    def keep(self, metrics: Mapping[int, Mapping[str, float] | None]) -> set[int]:
        """The steps to keep, given every stored step and its metrics (None: saved without)."""
        steps = sorted(metrics)
        if self.newest is None:
            return set(steps)
        kept = set(steps[max(0, len(steps) - self.newest) :]) if self.newest else set()
        kept.update(self.ranked(metrics)[: self.best])
        return kept


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
