"""Exponential moving average of the parameters, zero-initialised and debiased on read.

With ema_0 = 0 and ema_n = β_n ema_{n−1} + (1 − β_n) θ_n, the weights on the θ's sum to
1 − Π β_i, so ema_n / (1 − Π β_i) is an average (the same correction as Adam's moment
estimates; for a constant β it is ema / (1 − βⁿ)). Starting from zero instead of from θ_0 keeps
the random initialisation out of the average entirely. ``EMASpec``
says which leaves are averaged and how β_n evolves; untracked leaves hold the live parameter.
``CONFIG`` is the ``config.ema`` section and ``spec_from_config`` reads it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.scipy.special
import ml_collections
import numpy as np

from dew.pytrees import leaf_path
from dew.schema import ConfigError, Key, Section, at_least

Params = Any


@dataclasses.dataclass(frozen=True)
class EMASpec:
    """Say which leaves the EMA copy tracks, and how fast it follows them.

    The EMA starts at zero and follows ema_n = β_n·ema_{n−1} + (1−β_n)·θ_n at the n-th optimizer
    update (n ≥ 1). It is debiased when read (``dew.averaging.ema.debias``): the weights on the
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
        tracks = self.tracks
        if tracks is None:
            return jax.tree.map(lambda _: True, params)
        return jax.tree_util.tree_map_with_path(lambda path, _: bool(tracks(leaf_path(path))), params)

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


def zeros_like(params: Params, spec: EMASpec | None = None) -> Params:
    """The EMA before any update: zeros where tracked, the live parameter where not."""
    if spec is None or spec.tracks is None:
        return jax.tree.map(jnp.zeros_like, params)
    return jax.tree.map(lambda p, m: jnp.zeros_like(p) if m else p, params, spec.mask(params))


def update(ema: Params, params: Params, decay: float | EMASpec, num_updates: jax.Array | int = 1) -> Params:
    """The EMA after the ``num_updates``-th optimizer update (n ≥ 1); pure, runs inside jit.

    ``decay`` is a constant β or an ``EMASpec`` (β_n from its half-life/ramp-up, and its
    ``tracks`` predicate: untracked leaves copy the live parameter).
    """
    spec = decay if isinstance(decay, EMASpec) else EMASpec(decay=float(decay))
    beta = spec.decay_at(num_updates)

    def one(e: jax.Array, p: jax.Array, tracked: bool) -> jax.Array:
        if not tracked:
            return p
        return (beta * e + (1.0 - beta) * p).astype(e.dtype)

    return jax.tree.map(one, ema, params, spec.mask(params))


def debias(ema: Params, decay: float | EMASpec, num_updates: int | jax.Array) -> Params:
    """Bias-corrected EMA: ema / (1 − Π_{i≤n} β_i), i.e. ema / (1 − decayⁿ) for a constant decay.

    ``num_updates`` must be ≥ 1: after zero updates the EMA holds no information and the
    correction would divide by zero. A concrete 0 raises here; a traced count is clamped to 1 so
    a jitted caller gets a finite (zero) tree instead of NaNs. Untracked leaves (``EMASpec.tracks``)
    already hold the live parameter and are returned unchanged.
    """
    if not isinstance(num_updates, jax.core.Tracer) and int(num_updates) < 1:
        raise ValueError(
            f"ema.debias: num_updates must be >= 1, got {int(num_updates)}; "
            "the EMA has not been updated yet, so there is nothing to debias"
        )
    spec = decay if isinstance(decay, EMASpec) else EMASpec(decay=float(decay))
    if spec.half_life is None and spec.decay == 0.0:
        return ema
    n = jnp.maximum(jnp.asarray(num_updates, jnp.float32), 1.0)
    # One scalar factor, then a multiply: the same IEEE operations whether this runs eagerly
    # (restore_ema) or inside the Trainer's jit, where XLA may turn a division by a broadcast
    # scalar into a multiply by its reciprocal; so both give the same weights, bit for bit.
    scale = 1.0 / (1.0 - spec.retained(n))

    def one(e: jax.Array, tracked: bool) -> jax.Array:
        return (e * scale).astype(e.dtype) if tracked else e

    return jax.tree.map(one, ema, spec.mask(ema))


# --- the run's EMA as a record: what a checkpoint needs to debias on its own --------------------------
def record(spec: EMASpec, params: Params, accumulation: int = 1) -> dict[str, Any]:
    """The EMA a run keeps, as JSON: β's law (decay, half-life, ramp-up), the leaves it tracks
    (their paths, or None for all) and the micro-batches per update. A checkpoint stores it, so
    ``Checkpoints.restore_ema`` debiases with no argument."""
    mask = spec.mask(params)
    tracked = None
    if spec.tracks is not None:
        pairs = jax.tree_util.tree_leaves_with_path(mask)
        tracked = sorted(leaf_path(path) for path, on in pairs if on)
    return {
        "decay": float(spec.decay),
        "half_life": None if spec.half_life is None else float(spec.half_life),
        "ramp_up": None if spec.ramp_up is None else float(spec.ramp_up),
        "tracked": tracked,
        "accumulation": int(accumulation),
    }


def from_record(saved: dict[str, Any]) -> tuple[EMASpec, int]:
    """The ``EMASpec`` and accumulation a ``record`` describes."""
    tracked = saved.get("tracked")
    paths = None if tracked is None else frozenset(tracked)
    spec = EMASpec(
        decay=float(saved["decay"]),
        tracks=None if paths is None else paths.__contains__,
        half_life=saved.get("half_life"),
        ramp_up=saved.get("ramp_up"),
    )
    return spec, int(saved.get("accumulation", 1))


# --- the run's EMA as arrays: what a TrainState carries and a checkpoint's ``extra`` item stores ---
_EXACT = "<f8"  # the law's float parameters, kept exactly as their IEEE bits (JAX runs without x64)


def _bits(value: float) -> jax.Array:
    return jnp.asarray(np.array([value], _EXACT).view("<u4"))


def _unbits(bits: Any) -> float:
    return float(np.asarray(bits, "<u4").view(_EXACT)[0])


def law(spec: EMASpec, params: Params, accumulation: int = 1) -> dict[str, jax.Array]:
    """The EMA's law as the small arrays ``TrainState.ema_law`` holds and a checkpoint's ``extra``
    item stores, so that ``ema_params`` + ``extra`` debias on their own (``from_law``):

        decay, half_life, ramp_up   uint32[2] each: the float64 value's bits, exact (0: unset)
        accumulation                int32[]: micro-batches per optimizer update
        tracked                     bool[n], only when ``spec.tracks`` is set: whether each of
                                    ``params``' leaves (in ``jax.tree.leaves`` order) is averaged

    Traceable: ``make_init`` builds it inside the jitted init."""
    out = {
        "decay": _bits(spec.decay),
        "half_life": _bits(spec.half_life or 0.0),
        "ramp_up": _bits(spec.ramp_up or 0.0),
        "accumulation": jnp.asarray(accumulation, jnp.int32),
    }
    if spec.tracks is not None:
        out["tracked"] = jnp.asarray([bool(m) for m in jax.tree.leaves(spec.mask(params))], bool)
    return out


def from_law(saved: Any, params: Params) -> tuple[EMASpec, int]:
    """The ``EMASpec`` and accumulation a ``law`` (host or device arrays) describes; ``params``
    is the tree it was made for (shapes suffice), to name the tracked leaves."""
    half_life, ramp_up = _unbits(saved["half_life"]), _unbits(saved["ramp_up"])
    tracks = None
    if "tracked" in saved:
        mask = np.asarray(saved["tracked"], bool).ravel()
        paths = [leaf_path(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)]
        if len(paths) != mask.size:
            raise ValueError(
                f"the EMA law tracks {mask.size} parameter leaves, the parameter tree given has {len(paths)}"
            )
        tracks = frozenset(p for p, on in zip(paths, mask, strict=True) if on).__contains__
    spec = EMASpec(
        decay=_unbits(saved["decay"]),
        tracks=tracks,
        half_life=half_life or None,
        ramp_up=(ramp_up or None) if half_life else None,
    )
    return spec, int(np.asarray(saved["accumulation"]))


def same_law(a: EMASpec, b: EMASpec) -> bool:
    """Whether two specs give the same β_n (which leaves they track aside)."""
    if a.half_life is None and b.half_life is None:
        return a.decay == b.decay
    return a.half_life == b.half_life and a.ramp_up == b.ramp_up


# --- config.ema -----------------------------------------------------------------------------------
def _validate(section: ml_collections.ConfigDict, path: str) -> None:
    if section.ramp_up and not section.half_life:
        raise ConfigError(
            f"config.{path}.ramp_up={section.ramp_up!r} is invalid: expected 0 unless {path}.half_life is set"
        )
    try:
        re.compile(section.tracks)
    except re.error as e:
        raise ConfigError(
            f"config.{path}.tracks={section.tracks!r} is invalid: expected a regular expression ({e})"
        ) from None


CONFIG = Section(
    "exponential moving average of the weights (zero-initialised, debiased when read)",
    {
        "decay": Key(
            0.999,
            "β per optimizer update when half_life is 0",
            check=lambda v: 0.0 <= v < 1.0,
            accepted="a float in [0, 1)",
        ),
        "half_life": Key(
            0.0,
            "EDM's half-life in optimizer updates, replacing decay (0: use decay)",
            **at_least(0, "a float >= 0 (updates; 0: use ema.decay)"),
        ),
        "ramp_up": Key(
            0.0,
            "with half_life: β_n = 0.5^(1/min(half_life, ramp_up·n)) (0: no ramp-up)",
            **at_least(0, "a float >= 0 (0: no ramp-up)"),
        ),
        "tracks": Key(
            "", "regex searched in each parameter path; only matching leaves are averaged ('' = all)"
        ),
        "power_std_rels": Key(
            (),
            "post-hoc EMA (EDM2): power-function EMA profiles tracked in the step, e.g. (0.05, 0.1); ()=off",
            kind=tuple,
            item=float,
            check=lambda v: _valid_std_rels(v),
            accepted="distinct floats in (0, 0.2887) (std_rel; 1/√12 is the uniform average)",
        ),
        "snapshot_every": Key(
            0,
            "train steps between post-hoc EMA snapshots (<workdir>/power_ema; 0: checkpoint.every)",
            **at_least(0, "an int >= 0 (0: checkpoint.every)"),
        ),
    },
    validate=_validate,
)


def _valid_std_rels(values: tuple[float, ...]) -> bool:
    from dew.averaging import posthoc as posthoc_ema

    try:
        posthoc_ema.parse_std_rels(values, "power_std_rels")
    except ValueError:
        return False
    return True


def spec_from_config(section: ml_collections.ConfigDict) -> EMASpec:
    """The ``EMASpec`` a resolved ``config.ema`` describes."""
    pattern = re.compile(section.tracks) if section.tracks else None
    half_life = section.half_life or None
    return EMASpec(
        decay=section.decay,
        tracks=None if pattern is None else (lambda path: pattern.search(path) is not None),
        half_life=half_life,
        ramp_up=(section.ramp_up or None) if half_life else None,
    )


def get_debiased_ema(ema_params: Params, decay: float, num_updates: int | jax.Array) -> Params:
    """Bias-corrected EMA (Adam convention): ``ema_params / (1 - decay ** num_updates)``.

    Assumes ``ema_params`` was zero-initialised and has been updated ``num_updates`` times; the
    result is unbiased under stationary-parameter expectations, with the structure of
    ``ema_params``. Must not be called with ``num_updates == 0`` (division by zero: a concrete 0
    raises ``ValueError``). The stix name of ``debias`` with a constant decay.
    """
    return debias(ema_params, float(decay), num_updates)
