"""The precision policy: the dtype a network computes in, and the loss scale its gradients need.

``config.precision`` picks one of three policies (``docs/precision.md`` states which operations
stay in float32 and why):

* ``float32`` (the default): everything in float32, the step exactly as without a policy;
* ``bfloat16``: the network computes in bfloat16; parameters, gradients, optimizer state, EMA
  and checkpoints stay float32; no loss scale (bfloat16 has float32's exponent range);
* ``float16``: the network computes in float16 and the loss is scaled before differentiation so
  small gradients do not flush to zero: a ``static`` scale (NVlabs/edm's ``--ls``) or a
  ``dynamic`` one that doubles after ``growth_interval`` finite steps and halves on an overflow
  (the update is skipped and counted in ``loss_scale_overflows``, never applied).

The dynamic scale's state (``{"scale": f32[], "good_steps": i32[]}``) lives in
``TrainState.loss_scale`` and is checkpointed with the step count, so a resume continues with the
same scale; a run resumed under another policy creates or drops it.

What an objective needs of the policy (the compute dtype a run config names, a network's call in
that dtype: ``cast_floats``, ``compute_in``, ``compute_dtype_of``) is defined below the trainer,
in ``dew.contracts.precision``, and re-exported here.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections

from dew.contracts.precision import cast_floats, compute_dtype_of, compute_in
from dew.schema import ConfigError, Key, Section, at_least

COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
LOSS_SCALES = ("none", "static", "dynamic")


def _validate(section: ml_collections.ConfigDict, path: str) -> None:
    if section.compute == "float16" and section.loss_scale == "none":
        raise ConfigError(
            f"config.{path}.loss_scale='none' is invalid with {path}.compute='float16': float16 gradients "
            "underflow without a loss scale; expected 'static' (EDM's --ls, the value in "
            f"{path}.scale) or 'dynamic'"
        )


CONFIG = Section(
    "the network's compute dtype and the loss scale (parameters, optimizer state, EMA and "
    "checkpoints are float32 under every policy; docs/precision.md)",
    {
        "compute": Key(
            "float32",
            "the dtype the network computes in: float32, bfloat16, or float16 (needs a loss_scale)",
            choices=COMPUTE_DTYPES,
        ),
        "loss_scale": Key(
            "none",
            "'none', 'static' (the loss times scale, as NVlabs/edm's --ls) or 'dynamic' (starts at "
            "scale, doubles after growth_interval finite steps, halves on an overflow, whose update "
            "is skipped and counted in loss_scale_overflows)",
            choices=LOSS_SCALES,
        ),
        "scale": Key(
            2.0**15,
            "the static loss scale, or the dynamic one's starting value",
            check=lambda v: isinstance(v, int | float) and math.isfinite(v) and v > 0,
            accepted="a finite float > 0",
        ),
        "growth_interval": Key(
            2000,
            "dynamic: finite steps in a row before the scale doubles",
            **at_least(1, "an int >= 1"),
        ),
    },
    validate=_validate,
)


@dataclasses.dataclass(frozen=True)
class Precision:
    """A run's precision policy (see the module docstring). ``Precision()`` is float32 without
    a loss scale: the step it gives is the step without a policy, bit for bit."""

    compute: str = "float32"
    loss_scale: str = "none"
    scale: float = 2.0**15
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        if self.compute not in COMPUTE_DTYPES:
            raise ValueError(
                f"precision compute={self.compute!r} is unknown: expected one of {COMPUTE_DTYPES}"
            )
        if self.loss_scale not in LOSS_SCALES:
            raise ValueError(
                f"precision loss_scale={self.loss_scale!r} is unknown: expected one of {LOSS_SCALES}"
            )
        if self.compute == "float16" and self.loss_scale == "none":
            raise ValueError("precision compute='float16' needs loss_scale 'static' or 'dynamic'")

    @property
    def dtype(self) -> jnp.dtype:
        """The network's compute dtype."""
        return jnp.dtype(self.compute)

    @property
    def dynamic(self) -> bool:
        return self.loss_scale == "dynamic"

    def init_state(self) -> dict[str, jax.Array] | None:
        """The dynamic scale's starting state (``TrainState.loss_scale``), None otherwise."""
        if not self.dynamic:
            return None
        return {"scale": jnp.asarray(self.scale, jnp.float32), "good_steps": jnp.zeros((), jnp.int32)}

    def current_scale(self, state: dict[str, jax.Array] | None) -> jax.Array | None:
        """The factor the loss is multiplied by this step (None: no scaling)."""
        if self.loss_scale == "none":
            return None
        if self.dynamic:
            assert state is not None, "a dynamic loss scale needs its state (TrainState.loss_scale)"
            return state["scale"]
        return jnp.asarray(self.scale, jnp.float32)

    def next_state(
        self, state: dict[str, jax.Array] | None, finite: jax.Array
    ) -> dict[str, jax.Array] | None:
        """The dynamic scale after a step whose gradients were (not) ``finite``: halved (at least
        1) on an overflow, doubled after ``growth_interval`` finite steps in a row (as long as the
        doubled scale is finite)."""
        if not self.dynamic:
            return state
        assert state is not None, "a dynamic loss scale needs its state (TrainState.loss_scale)"
        scale, good = state["scale"], state["good_steps"]
        good = jnp.where(finite, good + 1, 0)
        grow = good >= self.growth_interval
        doubled = scale * 2
        grown = jnp.where(grow & jnp.isfinite(doubled), doubled, scale)
        scale = jnp.where(finite, grown, jnp.maximum(scale / 2, 1.0))
        return {"scale": scale, "good_steps": jnp.where(grow, 0, good).astype(jnp.int32)}


def from_config(config: ml_collections.ConfigDict | None) -> Precision:
    """``config.precision`` (resolved) as a ``Precision``; None (no section) is float32."""
    if config is None:
        return Precision()
    return Precision(config.compute, config.loss_scale, float(config.scale), int(config.growth_interval))


__all__ = [
    "COMPUTE_DTYPES",
    "CONFIG",
    "LOSS_SCALES",
    "Precision",
    "cast_floats",
    "compute_dtype_of",
    "compute_in",
    "from_config",
]
