"""What a diffusion model's samples look like to a person, on the host: the artifact for an array
of samples (an ``ImageGrid`` of images, a ``VideoGrid`` of clips, a scatter plot of points, a
latent run's samples decoded first), the count of non-finite samples a diverged model draws, and
the table of jitted draws that lets repeated previews and requests compile once each.

Each piece receives what it needs as arguments; ``dew.objectives.diffusion.Diffusion`` holds the
values (its latent space, the data's extent) and calls them. ``jitted_once`` keeps the jitted
draws of the other image objectives too (``meanflow``, ``imeanflow``, ``iddpm``, ``interpolant``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dew.artifacts import ImageGrid, VideoGrid
from dew.objectives import scatter
from dew.objectives.latent_space import LatentSpace


def finite_samples(samples: np.ndarray) -> tuple[np.ndarray, int]:
    """``(samples, how many rows held a NaN or inf)``, with NaN drawn grey (0) and ±inf saturated
    (±1): a diverged model's preview is shown and counted instead of being refused by the
    artifact or handed to metrics that cannot take it."""
    finite = np.isfinite(samples.reshape(len(samples), -1)).all(axis=1)
    return np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0), int(np.sum(~finite))


def to_artifact(
    samples: np.ndarray,
    captions: tuple[str, ...] | None,
    columns: int,
    *,
    latent: LatentSpace | None = None,
    extent: float | None = None,
) -> ImageGrid | VideoGrid:
    """Samples as the artifact a person sees: with ``latent``, decoded through its VAE to images
    in [-1, 1] first; then [n, 2] points as one scatter plot over [-extent, extent]² (``extent``
    None or 0: the samples' own), [n, T, H, W, C] clips as a ``VideoGrid`` (4 fps), [n, H, W, C]
    images as an ``ImageGrid`` of ``columns`` columns with ``captions``; values clipped to [-1, 1]."""
    if latent is not None:
        samples = latent.to_images(samples)
    if samples.ndim == 2:
        return scatter.scatter_grid(samples, extent or scatter.extent_of(samples))
    if samples.ndim == 5:
        return VideoGrid(np.clip(samples, -1.0, 1.0), fps=4)
    return ImageGrid(np.clip(samples, -1.0, 1.0), captions=captions, columns=columns)


def jitted_once(
    cache: dict[tuple, Callable[..., Any]], key: tuple, fn: Callable[..., Any], **static: Any
) -> Callable[..., Any]:
    """``jax.jit(partial(fn, **static))``, built once per ``key`` (the static settings) in
    ``cache`` and taken from it after."""
    if key not in cache:
        cache[key] = jax.jit(functools.partial(fn, **static))
    return cache[key]


__all__ = ["finite_samples", "jitted_once", "to_artifact"]
