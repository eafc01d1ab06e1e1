"""The contract between a trainer and what it trains.

An ``Objective`` is pure: it builds parameters, computes a loss and evaluation statistics from
(params, rng, batch). It never sees the optimizer, the mesh, checkpoints or trackers, so the same
objective runs under ``Trainer.fit`` or a user's own loop.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special

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

    The EMA starts at zero and follows ema_n = β_n·ema_{n−1} + (1−β_n)·θ_n at the n-th optimizer
    update (n ≥ 1). It is debiased when read (``dew.training.ema.debias``): the weights on the
    θ's sum to 1 − Π_{i≤n} β_i, so dividing by that makes early reads an average rather than a
    value dragged towards zero.

    How fast (β_n):
      * ``half_life=None``: a constant ``decay``.
      * ``half_life=H`` (in optimizer updates), ``ramp_up=None``: β = 0.5^(1/H), constant.
      * ``half_life=H``, ``ramp_up=r``: EDM's warm-up (Karras et al. 2022, training config
        ``ema_halflife_kimg``/``ema_rampup_ratio``, counted in updates instead of images):
        β_n = 0.5^(1 / min(H, r·n)), so early on the average spans only the last r·n updates.

    Which leaves: ``tracks`` is a predicate on a leaf's path (``"unet/~/conv/w"``, the
    ``/``-joined keys); ``None`` tracks every leaf. An untracked leaf's EMA entry holds the live
    parameter itself, so reading the EMA always yields a complete parameter tree. A predicate that
    matches no leaf is an error (``check``), raised before any step runs.
    """

    decay: float = 0.999
    tracks: Callable[[str], bool] | None = None
    half_life: float | None = None
    ramp_up: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"EMASpec.decay must be in [0, 1), got {self.decay}")
        if self.half_life is not None and not self.half_life > 0:
            raise ValueError(f"EMASpec.half_life must be > 0 updates (or None), got {self.half_life}")
        if self.ramp_up is not None:
            if self.half_life is None:
                raise ValueError("EMASpec.ramp_up needs a half_life: it ramps the half-life up to it")
            if not self.ramp_up > 0:
                raise ValueError(f"EMASpec.ramp_up must be > 0 (or None), got {self.ramp_up}")

    # --- how fast ------------------------------------------------------------------------------
    def decay_at(self, n: jax.Array | int) -> jax.Array:
        """β_n, the factor of the n-th update (n ≥ 1); traceable."""
        n = jnp.asarray(n, jnp.float32)
        if self.half_life is None:
            return jnp.asarray(self.decay, jnp.float32)
        span = jnp.asarray(self.half_life, jnp.float32)
        if self.ramp_up is not None:
            span = jnp.minimum(span, self.ramp_up * jnp.maximum(n, 1.0))
        return jnp.exp2(-1.0 / span)

    def retained(self, n: jax.Array | int) -> jax.Array:
        """Π_{i≤n} β_i: the weight the zero start still holds after n updates; traceable.

        With the ramp-up, log₂ Π β_i = −Σ_i 1/min(H, r·i) = −(ψ(m+1) + γ)/r − (n−m)/H with
        m = min(n, ⌊H/r⌋): the harmonic number H_m written with the digamma function ψ.
        """
        n = jnp.asarray(n, jnp.float32)
        if self.half_life is None:
            return jnp.asarray(self.decay, jnp.float32) ** n
        if self.ramp_up is None:
            return jnp.exp2(-n / self.half_life)
        m = jnp.minimum(n, jnp.floor(self.half_life / self.ramp_up))
        harmonic = jax.scipy.special.digamma(m + 1.0) + _EULER_GAMMA
        return jnp.exp2(-(harmonic / self.ramp_up + (n - m) / self.half_life))

    # --- which leaves --------------------------------------------------------------------------
    def mask(self, params: Params) -> Any:
        """A tree of bools shaped like ``params``: True where the EMA averages the leaf."""
        if self.tracks is None:
            return jax.tree.map(lambda _: True, params)
        return jax.tree_util.tree_map_with_path(lambda path, _: bool(self.tracks(leaf_path(path))), params)

    def check(self, params: Params) -> None:
        """Raise before training if ``tracks`` matches no leaf of ``params`` (shapes suffice)."""
        if self.tracks is not None and not any(jax.tree.leaves(self.mask(params))):
            paths = [leaf_path(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
            shown = ", ".join(paths[:6]) + (", ..." if len(paths) > 6 else "")
            raise ValueError(
                f"EMASpec.tracks matches none of the {len(paths)} parameter leaves ({shown}); "
                "give a predicate that is true for at least one of these paths, or None for all"
            )


_EULER_GAMMA = 0.5772156649015329


def leaf_path(path: tuple[Any, ...]) -> str:
    """A pytree key path as ``"a/b/c"``: dict keys, attribute names and sequence indices."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


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
