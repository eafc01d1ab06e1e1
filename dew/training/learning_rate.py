"""Learning-rate schedules the optimizer section names (``config.optimizer.schedule``).

* ``linear_warmup``: a linear ramp from 0 over ``warmup_steps`` updates, then constant (EDM's
  ``lr_rampup_kimg``; no ramp when ``warmup_steps`` is 0).
* ``inverse_sqrt``: EDM2's (Karras et al. 2024, Eq. 18), NVlabs/edm2
  ``training/training_loop.py`` ``learning_rate_schedule(cur_nimg, batch_size, ref_lr,
  ref_batches, rampup_Mimg)``: α_ref / √max(t / t_ref, 1), times min(images / rampup, 1), with
  t the updates done (``cur_nimg / batch_size``) and ``images_per_update`` the reference's
  ``batch_size`` (images per optimizer update).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("linear_warmup", "inverse_sqrt")


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
