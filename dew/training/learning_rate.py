"""The optimizer a run trains with: ``config.optimizer`` (Adam, optional global-norm clipping,
and the learning-rate schedule ``config.optimizer.schedule`` names) and ``make_optimizer``, which
builds it from the resolved config. The schedules:

* ``linear_warmup``: a linear ramp from 0 over ``warmup_steps`` updates, then constant (EDM's
  ``lr_rampup_kimg``; no ramp when ``warmup_steps`` is 0).
* ``inverse_sqrt``: EDM2's (Karras et al. 2024, Eq. 18), NVlabs/edm2
  ``training/training_loop.py`` ``learning_rate_schedule(cur_nimg, batch_size, ref_lr,
  ref_batches, rampup_Mimg)``: α_ref / √max(t / t_ref, 1), times min(images / rampup, 1), with
  t the updates done (``cur_nimg / batch_size``) and ``images_per_update`` the reference's
  ``batch_size`` (images per optimizer update).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from dew.schema import ConfigError, Key, Section

SCHEDULES = ("linear_warmup", "inverse_sqrt")
MOMENT_DTYPES = ("float32", "bfloat16")


def finite_number(value: Any) -> bool:
    """A real number that is neither inf nor NaN (checked before anything compiles)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def linear_warmup(learning_rate: float, warmup_steps: float) -> optax.Schedule | float:
    """The learning rate of the n-th optimizer update (n = 0, 1, ...): lr·min(n/W, 1), W =
    ``warmup_steps`` (fractional allowed), or the constant lr for W = 0.

    NVlabs/edm's ramp-up (``training_loop.py``: ``lr * min(cur_nimg / (lr_rampup_kimg * 1000), 1)``
    with ``cur_nimg`` the images seen before the update) is this with W = lr_rampup_kimg·1000 /
    images per update, since optax's count n is the updates before this one.
    """
    if not warmup_steps:
        return learning_rate
    return lambda count: learning_rate * jnp.minimum(count / warmup_steps, 1.0)


def inverse_sqrt(
    ref_lr: float, ref_batches: float, rampup_Mimg: float, images_per_update: int
) -> optax.Schedule:
    """``count -> lr`` with count the optimizer updates done so far (optax's), so the update
    that moves the weights from ``cur_nimg = count · images_per_update`` uses the reference's
    ``learning_rate_schedule(cur_nimg, images_per_update, ref_lr, ref_batches, rampup_Mimg)``."""
    if not (ref_lr > 0 and ref_batches >= 0 and rampup_Mimg >= 0 and images_per_update >= 1):
        raise ValueError(
            f"inverse_sqrt: need ref_lr > 0, ref_batches >= 0, rampup_Mimg >= 0, images_per_update >= 1; "
            f"got {ref_lr}, {ref_batches}, {rampup_Mimg}, {images_per_update}"
        )

    def schedule(count: jax.typing.ArrayLike) -> jax.Array:
        nimg = jnp.asarray(count, jnp.float32) * images_per_update
        lr = jnp.float32(ref_lr)
        if ref_batches > 0:
            lr = lr / jnp.sqrt(jnp.maximum(nimg / (ref_batches * images_per_update), 1.0))
        if rampup_Mimg > 0:
            lr = lr * jnp.minimum(nimg / (rampup_Mimg * 1e6), 1.0)
        return lr

    return schedule


def _check_schedule(section: ml_collections.ConfigDict, path: str) -> None:
    if section.schedule == "inverse_sqrt" and section.warmup_steps:
        raise ConfigError(
            f"config.{path}.warmup_steps={section.warmup_steps} is invalid with schedule='inverse_sqrt' "
            "(its ramp-up is rampup_Mimg); expected 0"
        )


OPTIMIZER_CONFIG = Section(
    "Adam with a learning-rate schedule (linear warm-up or EDM2's inverse square root) and "
    "optional global-norm clipping",
    {
        "learning_rate": Key(
            1e-3,
            "peak learning rate",
            check=lambda v: finite_number(v) and v > 0,
            accepted="a finite float > 0",
        ),
        "warmup_steps": Key(
            0,
            "optimizer updates W of linear warm-up from 0: the n-th update (n = 0, 1, ...) takes "
            "learning_rate·min(n/W, 1); W may be fractional (EDM's lr_rampup_kimg·1000 / images per "
            "update), 0: off",
            kind=float,
            check=lambda v: finite_number(v) and v >= 0,
            accepted="a finite number >= 0 (0: off)",
        ),
        "b1": Key(0.9, "Adam β1", check=lambda v: 0 <= v < 1, accepted="a float in [0, 1)"),
        "b2": Key(0.999, "Adam β2", check=lambda v: 0 <= v < 1, accepted="a float in [0, 1)"),
        "eps": Key(
            1e-8,
            "Adam ε, added to √v̂ in the update's denominator (torch.optim.Adam's eps, optax's eps)",
            check=lambda v: finite_number(v) and v > 0,
            accepted="a finite float > 0",
        ),
        "mu_dtype": Key(
            "float32",
            "the dtype Adam keeps its first moment in (optax's mu_dtype): float32, or bfloat16 to "
            "halve that moment's memory (big_vision's large-model configs; the second moment, the "
            "parameters and the EMA stay float32)",
            choices=MOMENT_DTYPES,
        ),
        "grad_clip": Key(
            0.0,
            "clip gradients to this global norm (0: off)",
            check=lambda v: finite_number(v) and v >= 0,
            accepted="a finite float >= 0 (0: off)",
        ),
        "schedule": Key(
            "linear_warmup",
            "learning-rate schedule: linear_warmup (warmup_steps, then constant) or inverse_sqrt "
            "(EDM2: learning_rate / sqrt(max(updates / ref_batches, 1)), ramped up over rampup_Mimg)",
            choices=SCHEDULES,
        ),
        "ref_batches": Key(
            70000.0,
            "inverse_sqrt: t_ref, the updates after which the rate decays as 1/sqrt (0: no decay)",
            check=lambda v: finite_number(v) and v >= 0,
            accepted="a finite float >= 0 (0: no decay)",
        ),
        "rampup_Mimg": Key(
            10.0,
            "inverse_sqrt: millions of training images of linear ramp-up from 0 (0: none)",
            check=lambda v: finite_number(v) and v >= 0,
            accepted="a finite float >= 0 (0: no ramp-up)",
        ),
    },
    validate=_check_schedule,
)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Adam with linear warm-up (EDM's lr ramp-up) or EDM2's inverse-square-root schedule
    (the schedules above; images per update = ``dataset.batch_size`` ×
    ``train.accumulation``), and optional global-norm clipping."""
    o = config.optimizer
    if o.schedule == "inverse_sqrt":
        images_per_update = config.dataset.batch_size * config.train.accumulation
        schedule = inverse_sqrt(o.learning_rate, o.ref_batches, o.rampup_Mimg, images_per_update)
    else:
        schedule = linear_warmup(o.learning_rate, o.warmup_steps)
    mu_dtype = None if o.mu_dtype == "float32" else jnp.dtype(o.mu_dtype)
    adam = optax.adam(schedule, b1=o.b1, b2=o.b2, eps=o.eps, mu_dtype=mu_dtype)
    return optax.chain(optax.clip_by_global_norm(o.grad_clip), adam) if o.grad_clip > 0 else adam
