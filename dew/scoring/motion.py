"""How clips move: the statistics that say whether generated moving-digit clips
([N, T, 16, 16, 1] in [-1, 1], ``dew.data.sources.moving_digits``) move like the data set's,
read with the independent digit classifier."""

from __future__ import annotations

import numpy as np

from dew.data.sources.moving_digits import CANVAS, DIGIT
from dew.scoring.digits_classifier import classify_digits


def centre_of_brightness(frames: np.ndarray) -> np.ndarray:
    """[M, 16, 16, 1] frames in [-1, 1] -> [M, 2] (y, x) centre of their brightness (pixels)."""
    light = (frames[..., 0] + 1.0) / 2.0
    ys, xs = np.mgrid[: frames.shape[1], : frames.shape[2]]
    mass = light.sum((1, 2)) + 1e-6
    return np.stack([(light * ys).sum((1, 2)) / mass, (light * xs).sum((1, 2)) / mass], -1)


def digit_window(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where a frame's digit is: the 8x8 window centred on the frame's centre of brightness
    (clipped to the canvas), as ([M, 8, 8, 1] windows, [M, 2] top-left corners)."""
    corners = np.clip(np.rint(centre_of_brightness(frames) - (DIGIT - 1) / 2), 0, CANVAS - DIGIT).astype(int)
    windows = np.stack([frames[m, y : y + DIGIT, x : x + DIGIT] for m, (y, x) in enumerate(corners)])
    return windows, corners


def motion_statistics(clips: np.ndarray, labels: np.ndarray | None = None) -> dict[str, float]:
    """Numbers that say whether clips [N, T, 16, 16, 1] move like the dataset's.

    - ``frame_accuracy`` (with ``labels``): share of frames whose brightest 8x8 window the
      independent digit classifier (``dew.scoring.digits_classifier``) reads, in the window
      ``digit_window`` finds, as the clip's label.
    - ``identity_consistency``: share of clips whose frames all read as the same digit.
    - ``mean_displacement``: mean distance (pixels) the frame's centre of brightness moves
      between consecutive frames (real clips: speeds drawn from {1, 2} per axis).
    - ``constant_velocity_error``: mean |second difference| of that centre (0 for straight
      constant-velocity motion; bounces and noise raise it).
    """
    n, t = clips.shape[:2]
    frames = clips.reshape(n * t, CANVAS, CANVAS, 1)
    windows, _ = digit_window(frames)
    predicted = classify_digits(np.clip(windows, -1, 1)).reshape(n, t)
    centre = centre_of_brightness(frames).reshape(n, t, 2)
    step = np.diff(centre, axis=1)
    out = {
        "identity_consistency": float(np.mean((predicted == predicted[:, :1]).all(axis=1))),
        "mean_displacement": float(np.linalg.norm(step, axis=-1).mean()),
        "constant_velocity_error": float(np.linalg.norm(np.diff(step, axis=1), axis=-1).mean()),
    }
    if labels is not None:
        out["frame_accuracy"] = float(np.mean(predicted == np.asarray(labels)[:, None]))
    return out


__all__ = ["centre_of_brightness", "digit_window", "motion_statistics"]
