"""The contract between a trainer and what it trains.

An ``Objective`` is pure: it builds parameters, computes a loss and evaluation statistics from
(params, rng, batch). It never sees the optimizer, the mesh, checkpoints or trackers, so the same
objective runs under ``Trainer.fit`` or a user's own loop.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from dew.inputs import InputSpec

Params = Any
Batch = Mapping[str, jax.Array]
Stats = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Step:
    """What the trainer tells an objective about the current step.

    ``index`` is the optimizer step (a traced int32 inside jit), counted from 0.
    """

    index: jax.Array
    is_training: bool = True


@dataclasses.dataclass(frozen=True)
class Aux:
    """Everything a loss returns besides its statistics: per-example outputs a caller may want
    (e.g. predictions for a probe). Empty for most objectives."""

    outputs: Mapping[str, jax.Array] = dataclasses.field(default_factory=dict)


jax.tree_util.register_dataclass(Aux, data_fields=["outputs"], meta_fields=[])


@dataclasses.dataclass(frozen=True)
class EMASpec:
    """Say which leaves the EMA copy tracks, and how fast it follows them.

    ``decay`` is the per-step factor β of ema ← β·ema + (1−β)·params. The EMA starts at zero and
    is debiased when read (``dew.training.ema.debias``), so early evaluations are not dragged
    towards zero. Every parameter leaf is tracked.
    """

    decay: float = 0.999

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"EMASpec.decay must be in [0, 1), got {self.decay}")


class Objective(abc.ABC):
    """Define what is being learned: the parameters, the loss, what evaluation produces."""

    input_spec: InputSpec

    @abc.abstractmethod
    def init(self, rng: jax.Array, batch: Batch) -> Params:
        """Fresh parameters for batches shaped like ``batch``."""

    @abc.abstractmethod
    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        """Scalar loss to minimise, with scalar statistics and auxiliary outputs."""

    def evaluate(self, params: Params, rng: jax.Array, batch: Batch) -> Stats:
        """Scalar statistics on a held-out batch; by default the loss's own statistics."""
        step = Step(index=jax.numpy.int32(0), is_training=False)
        loss, (stats, _) = self.loss(params, rng, batch, step)
        return {**stats, "loss": loss}
