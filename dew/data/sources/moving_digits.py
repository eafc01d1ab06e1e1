"""Moving digits: deterministic clips of one real 8x8 handwritten digit gliding across a 16x16
canvas and bouncing off its edges (a CPU-sized Moving-MNIST).

Generator (fixed, documented so a clip can be rebuilt by hand): clip i of a split uses the i-th
image of the same split of ``digits`` (scikit-learn's ``load_digits``, every 10th image held out
for validation), so train and validation clips never share a handwritten digit. With
``rng = numpy.random.default_rng(SEED + i)`` (``SEED`` = 1000 for validation, 0 for train) the
start corner (y0, x0) is drawn uniformly from {0..8}² and the velocity (vy, vx) uniformly from
{-2, -1, 1, 2}², then for t = 0..FRAMES−1 the position moves by the velocity and reflects at 0 and
8 (the last position where the 8x8 digit fits). The digit (in [-1, 1], background −1) is pasted
at the position; frames are [16, 16, 1].

Fields: ``video`` [N, FRAMES, 16, 16, 1] float32 in [-1, 1], ``label`` [N] (the digit's class),
``position`` [N, FRAMES, 2] (top-left corner of the digit in each frame, int32).
"""

from __future__ import annotations

import functools

import numpy as np

from dew import registry
from dew.data.dataset import Source

FRAMES = 8
CANVAS = 16
DIGIT = 8
SPEEDS = (-2, -1, 1, 2)
SEEDS = {"train": 0, "validation": 1000}


def bounce(
    start: int, velocity: int, frames: int, limit: int = CANVAS - DIGIT
) -> tuple[np.ndarray, np.ndarray]:
    """Positions of one coordinate over ``frames`` frames, reflecting at 0 and ``limit``; also
    the velocity in effect after each frame."""
    positions, speeds = [], []
    p, v = start, velocity
    for _ in range(frames):
        positions.append(p)
        speeds.append(v)
        p += v
        if p < 0:
            p, v = -p, -v
        elif p > limit:
            p, v = 2 * limit - p, -v
    return np.array(positions), np.array(speeds)


def render(digit: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """[FRAMES, 16, 16, 1] frames with ``digit`` [8, 8, 1] (in [-1, 1]) at each (y, x)."""
    frames = np.full((len(positions), CANVAS, CANVAS, 1), -1.0, np.float32)
    for t, (y, x) in enumerate(positions):
        frames[t, y : y + DIGIT, x : x + DIGIT] = digit
    return frames


@functools.lru_cache(maxsize=2)
def moving_digits(split: str = "train") -> Source:
    """The ``train`` (1,617 clips) or ``validation`` (180) split (see the module docstring)."""
    from dew.data.sources.digits import digits

    if split not in SEEDS:
        raise ValueError(f"moving_digits: split must be 'train' or 'validation', got {split!r}")
    base = digits(split)
    images, labels = base.fields["image"], base.fields["label"]
    clips = np.empty((len(images), FRAMES, CANVAS, CANVAS, 1), np.float32)
    positions = np.empty((len(images), FRAMES, 2), np.int32)
    for i, digit in enumerate(images):
        rng = np.random.default_rng(SEEDS[split] + i)
        y0, x0 = (int(v) for v in rng.integers(0, CANVAS - DIGIT + 1, size=2))
        vy, vx = (int(v) for v in rng.choice(SPEEDS, size=2))
        ys, _ = bounce(y0, vy, FRAMES)
        xs, _ = bounce(x0, vx, FRAMES)
        positions[i] = np.stack([ys, xs], axis=1)
        clips[i] = render(digit, positions[i])
    return Source(
        name=f"moving_digits/{split}",
        fields={"video": clips, "label": labels.astype(np.int32), "position": positions},
        num_classes=10,
        sample_field="video",
    )


registry.datasets.register("moving_digits", moving_digits)
