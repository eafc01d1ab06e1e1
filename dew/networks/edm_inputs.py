"""Argument checks and the conditioning inputs shared by the EDM U-Nets."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_choice(network: str, field: str, value, accepted: tuple) -> None:
    if value not in accepted:
        raise ValueError(f"{network}: {field}={value!r} is unknown: expected one of {accepted}")


def embed_conditions(
    network: str,
    label_dim: int | None,
    augment_dim: int,
    label: jax.Array | None,
    augment_labels: jax.Array | None,
    batch: int,
) -> tuple[jax.Array | None, jax.Array | None]:
    """The class and augmentation vectors the mapping network sees, or None where it has no map.

    * ``label_dim`` None: the label's own width (no label: no ``map_label``); 0: no label may be
      given; > 0: a missing label is the zero vector (``EDMPrecond`` passes zeros), a given one
      must be [B, label_dim].
    * ``augment_dim`` > 0: missing augmentation labels are zeros, which is exactly the
      reference's skipping of ``map_augment`` (it has no bias) and keeps its parameters built.
    """
    if label is not None:
        if label.ndim != 2 or label.shape[0] != batch:
            raise ValueError(f"{network}: label must be [batch={batch}, label_dim], got shape {label.shape}")
        if label_dim == 0:
            raise ValueError(f"{network}: label_dim=0 builds an unconditional network, but a label was given")
        if label_dim is not None and label.shape[1] != label_dim:
            raise ValueError(f"{network}: label_dim={label_dim} but the label has width {label.shape[1]}")
        label = label.astype(jnp.float32)
    elif label_dim:
        label = jnp.zeros((batch, label_dim), jnp.float32)
    if augment_dim < 0:
        raise ValueError(f"{network}: augment_dim must be >= 0, got {augment_dim}")
    if augment_labels is not None:
        if not augment_dim:
            raise ValueError(f"{network}: augment_labels given but augment_dim=0 builds no map_augment")
        if augment_labels.shape != (batch, augment_dim):
            raise ValueError(
                f"{network}: augment_labels must be [batch={batch}, augment_dim={augment_dim}], "
                f"got {augment_labels.shape}"
            )
        augment_labels = augment_labels.astype(jnp.float32)
    elif augment_dim:
        augment_labels = jnp.zeros((batch, augment_dim), jnp.float32)
    return label, augment_labels
