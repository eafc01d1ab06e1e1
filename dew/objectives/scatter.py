"""Scatter plots of 2D points as an ``ImageGrid``: how a point-valued objective shows samples.

A preview picture is a density raster: each pixel's darkness is the number of points falling in
it, on a log scale so sparse tails stay visible. Nothing here draws with a plotting library.
"""

from __future__ import annotations

import numpy as np

from dew.artifacts import ImageGrid


def extent_of(points: np.ndarray, margin: float = 1.15) -> float:
    """A square half-width that holds ``points`` ([N, 2]) with a margin: max |coordinate| x margin."""
    points = np.asarray(points, np.float64)
    return float(np.max(np.abs(points)) * margin) if points.size else 1.0


def scatter_grid(points: np.ndarray, extent: float, size: int = 96) -> ImageGrid:
    """[N, 2] points -> one ``size`` x ``size`` greyscale picture of [-extent, extent]²: white
    where there is no point, darker where more points fall (log scale). Points outside the
    extent are dropped, so a run that diverges shows an empty picture rather than a rescaled one.
    The y axis points up."""
    points = np.asarray(points, np.float64)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"scatter_grid: points must be [N, 2], got shape {points.shape}")
    if not extent > 0:
        raise ValueError(f"scatter_grid: extent must be > 0, got {extent}")
    edges = np.linspace(-extent, extent, size + 1)
    counts, _, _ = np.histogram2d(points[:, 1], points[:, 0], bins=(edges, edges))
    counts = counts[::-1]  # row 0 is the top of the picture: largest y
    darkness = np.log1p(counts) / max(np.log1p(counts.max()), 1e-12)
    picture = 1.0 - 2.0 * darkness  # 1: white, -1: black
    return ImageGrid(picture[None, :, :, None].astype(np.float32), columns=1)
