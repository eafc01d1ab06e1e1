"""The diffusion objective's augmentation (NVlabs/edm ``training/loss.py``: ``y, augment_labels =
augment_pipe(images)`` before noising, the labels given to the network as ``augment_labels``).

Settings come from ``config.objective.augment`` (``dew.augment.settings``); the network sees
the labels when its ``augment_dim`` (``config.model.augment_dim``, the reference's
``network_kwargs.augment_dim = 9`` for its ``--augment`` setting) equals the pipeline's label
count, and not at all with ``augment_dim`` = 0 or a network without one (the reference's
networks skip ``map_augment`` then). Sampling passes no labels: the EDM networks take zeros,
"not augmented", as the reference's samplers do.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax

from dew import registry
from dew.augment.pipeline import augment
from dew.augment.settings import AugmentSettings, check_images
from dew.schema import ConfigError

# The key of the augmentation draws: fold_in(step key, AUGMENT_STREAM), so the loss's other
# draws (σ, noise, condition dropout, dropout) are those of a run without augmentation.
AUGMENT_STREAM = 0x617567  # "aug"


def from_config(config: Any, sample_shape: tuple[int, ...]) -> tuple[AugmentSettings | None, bool]:
    """``(settings or None when off, whether the network takes the labels)`` for a resolved
    config, checked against the samples' shape and ``config.model.augment_dim``."""
    settings = AugmentSettings.from_config(config.objective.augment)
    if not settings.enabled:
        return None, False
    check_images(settings, tuple(sample_shape))
    parameters = inspect.signature(registry.models[config.model.name]).parameters
    if "augment_dim" not in parameters:
        return settings, False
    augment_dim = config.model.get("augment_dim", parameters["augment_dim"].default)
    if augment_dim not in (0, settings.label_dim):
        raise ConfigError(
            f"config.model.augment_dim={augment_dim!r} is invalid: config.objective.augment gives "
            f"{settings.label_dim} augmentation labels; expected {settings.label_dim} (or 0 to not "
            "condition on them)"
        )
    return settings, augment_dim == settings.label_dim


def augmented(
    settings: AugmentSettings | None, feeds_labels: bool, rng: jax.Array, images: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
    """``(images, augment_labels or None)``: the batch through the pipeline, drawing from
    ``fold_in(rng, AUGMENT_STREAM)``; unchanged and None when augmentation is off."""
    if settings is None:
        return images, None
    images, labels = augment(settings, jax.random.fold_in(rng, AUGMENT_STREAM), images)
    return images, labels if feeds_labels else None
