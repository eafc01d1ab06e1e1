"""What evaluation hands to trackers: typed, validated media, independent of any backend."""

from __future__ import annotations

import dataclasses

import numpy as np


def _check_range(name: str, x: np.ndarray) -> None:
    if x.size and (not np.all(np.isfinite(x)) or x.min() < -1.0 - 1e-3 or x.max() > 1.0 + 1e-3):
        raise ValueError(f"{name}: values must be finite and in [-1, 1], got [{x.min()}, {x.max()}]")


def _to_uint8(x: np.ndarray) -> np.ndarray:
    """[-1, 1] floats to [0, 255] bytes, rounded."""
    return np.clip((x + 1.0) * 127.5 + 0.5, 0, 255).astype(np.uint8)


def _tile(pixels: np.ndarray, cols: int, pad: int) -> np.ndarray:
    """[N, H, W, C] uint8 to one [H', W', C] grid, ``cols`` wide, grey gutters ``pad`` wide."""
    n, h, w, c = pixels.shape
    rows = int(np.ceil(n / cols))
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 128, np.uint8)
    for i in range(n):
        r, k = divmod(i, cols)
        y, x = pad + r * (h + pad), pad + k * (w + pad)
        grid[y : y + h, x : x + w] = pixels[i]
    return grid


@dataclasses.dataclass(frozen=True)
class ImageGrid:
    """Images in [-1, 1], [N, H, W, C], with the text each was conditioned on where there was
    any. ``columns`` sets the grid width (e.g. one row per class)."""

    images: np.ndarray
    captions: tuple[str, ...] | None = None
    columns: int | None = None

    def __post_init__(self) -> None:
        images = np.asarray(self.images, dtype=np.float32)
        if images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise ValueError(f"ImageGrid.images must be [N, H, W, 1|3], got shape {images.shape}")
        _check_range("ImageGrid.images", images)
        if self.captions is not None and len(self.captions) != len(images):
            raise ValueError(f"ImageGrid: {len(self.captions)} captions for {len(images)} images")
        object.__setattr__(self, "images", images)

    def to_uint8_grid(self, scale: int = 1, pad: int = 1) -> np.ndarray:
        """Tile into one [H', W', C] uint8 picture; ``scale`` enlarges pixels for tiny images."""
        cols = self.columns or int(np.ceil(np.sqrt(len(self.images))))
        pixels = _to_uint8(self.images).repeat(scale, axis=1).repeat(scale, axis=2)
        return _tile(pixels, cols, pad)


@dataclasses.dataclass(frozen=True)
class VideoGrid:
    """Clips in [-1, 1], [N, T, H, W, C]."""

    clips: np.ndarray
    fps: int = 8

    def __post_init__(self) -> None:
        clips = np.asarray(self.clips, dtype=np.float32)
        if clips.ndim != 5:
            raise ValueError(f"VideoGrid.clips must be [N, T, H, W, C], got shape {clips.shape}")
        _check_range("VideoGrid.clips", clips)
        if clips.shape[-1] not in (1, 3):
            raise ValueError(f"VideoGrid.clips must have 1 or 3 channels, got shape {clips.shape}")
        if self.fps < 1:
            raise ValueError(f"VideoGrid.fps must be >= 1, got {self.fps}")
        object.__setattr__(self, "clips", clips)

    def to_uint8_frames(self, scale: int = 1, pad: int = 1) -> np.ndarray:
        """The clips side by side, one tiled [T, H', W', C] uint8 frame per time step."""
        n, t, _, _, _ = self.clips.shape
        cols = int(np.ceil(np.sqrt(n)))
        pixels = _to_uint8(self.clips).repeat(scale, axis=2).repeat(scale, axis=3)
        return np.stack([_tile(pixels[:, i], cols, pad) for i in range(t)])


@dataclasses.dataclass(frozen=True)
class TextSamples:
    """Generated token rows, with optional decoded preview text and prompt."""

    tokens: np.ndarray
    text: tuple[str, ...] | None = None
    prompt: str | None = None

    def __post_init__(self) -> None:
        if np.ndim(self.tokens) != 2:
            raise ValueError(f"TextSamples.tokens must be [N, L], got shape {np.shape(self.tokens)}")
        if self.text is not None and len(self.text) != len(self.tokens):
            raise ValueError(f"TextSamples: {len(self.text)} texts for {len(self.tokens)} token rows")

    def to_lines(self) -> list[str]:
        """One line per sample: the decoded text where there is some, else the token ids."""
        if self.text is not None:
            return [t.replace("\n", " ") for t in self.text]
        return [" ".join(str(int(t)) for t in row) for row in np.asarray(self.tokens)]

    def to_text(self) -> str:
        """A plain-text report: the prompt (if any), then one numbered line per sample."""
        head = [f"prompt: {self.prompt}", ""] if self.prompt is not None else []
        return "\n".join(head + [f"{i}: {line}" for i, line in enumerate(self.to_lines())]) + "\n"


@dataclasses.dataclass(frozen=True)
class TokenScores:
    """Teacher-forced per-token losses [N, L] and the weight of each target: 1 where it counts,
    0 where it is padding or a document's first token."""

    losses: np.ndarray
    weights: np.ndarray

    def __post_init__(self) -> None:
        if np.shape(self.losses) != np.shape(self.weights) or np.ndim(self.losses) != 2:
            raise ValueError(
                f"TokenScores: losses {np.shape(self.losses)} and weights "
                f"{np.shape(self.weights)} must both be [N, L]"
            )


@dataclasses.dataclass(frozen=True)
class Representations:
    """Encoder outputs [N, D] and the labels of the records they came from, for a probe."""

    features: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        if np.ndim(self.features) != 2 or len(self.features) != len(self.labels):
            raise ValueError(
                f"Representations: features must be [N, D] with N labels, got "
                f"{np.shape(self.features)} and {np.shape(self.labels)}"
            )
