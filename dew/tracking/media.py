"""Artifacts as pictures and files: the pixels every backend shows, encoded with Pillow.

One conversion for all backends, so a preview looks the same in the local PNG, TensorBoard,
MLflow and W&B. Tiny images (8x8 digits) are enlarged to about 64 pixels a side, with a grey
gutter of half a source pixel so neighbouring samples do not read as one shape.
``artifact_files`` is the one list of files an artifact becomes (the local tracker writes them,
MLflow uploads them); the drawing itself is in ``render``.
"""

from __future__ import annotations

import io
import os

import numpy as np

from dew.artifacts import ImageGrid, Representations, TextSamples, TokenScores, VideoGrid
from dew.tracking.render import (
    _scale,
    image_pixels,
    representations_pixels,
    text_html,
    token_scores_html,
    token_scores_pixels,
)

__all__ = ["artifact_files", "encode_gif", "encode_png", "image_pixels", "video_frames"]


def video_frames(video: VideoGrid) -> np.ndarray:
    """The clips as [T, H, W, C] uint8 frames, tiled and enlarged like ``image_pixels``."""
    scale = _scale(video.clips.shape[2])
    return video.to_uint8_frames(scale=scale, pad=max(2, scale // 2))


def _pil(pixels: np.ndarray):  # -> PIL.Image.Image
    from PIL import Image

    return Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)


def encode_png(pixels: np.ndarray) -> bytes:
    """[H, W, 1|3] uint8 to PNG bytes."""
    out = io.BytesIO()
    _pil(pixels).save(out, format="PNG")
    return out.getvalue()


def encode_gif(frames: np.ndarray, fps: int) -> bytes:
    """[T, H, W, 1|3] uint8 to an endlessly looping animated GIF."""
    images = [_pil(frame).convert("RGB") for frame in frames]
    out = io.BytesIO()
    images[0].save(
        out, format="GIF", save_all=True, append_images=images[1:], duration=max(1, round(1000 / fps)), loop=0
    )
    return out.getvalue()


def write_atomically(path: str, data: bytes) -> str:
    """Write ``data`` to ``path`` through a temporary file, so a reader never sees half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def write_png(path: str, grid: ImageGrid, scale: int | None = None) -> str:
    """Save an ImageGrid as one PNG; tiny images are enlarged so a person can see them."""
    return write_atomically(path, encode_png(image_pixels(grid, scale)))


def write_gif(path: str, video: VideoGrid) -> str:
    """Save a VideoGrid as one animated GIF at its frame rate."""
    return write_atomically(path, encode_gif(video_frames(video), video.fps))


def encode_npz(**arrays: np.ndarray) -> bytes:
    """Arrays as an ``.npz`` (numeric arrays only: readable with ``allow_pickle=False``)."""
    out = io.BytesIO()
    np.savez(out, **arrays, allow_pickle=False)
    return out.getvalue()


def artifact_files(stem: str, artifact: object) -> list[tuple[str, str, bytes]]:
    """The files an artifact becomes, as (folder, file name, bytes); [] for an unknown object.

    ImageGrid -> ``images/<stem>.png`` (captions drawn under each image); VideoGrid ->
    ``videos/<stem>.gif``; TextSamples -> ``text/<stem>.txt`` and ``.html``; TokenScores ->
    ``scores/<stem>.html`` (heat-coloured) and ``.png`` (the same cells, drawn);
    Representations -> ``representations/<stem>.png`` (PCA scatter by label) and ``.npz``
    (``features``, ``labels``).
    """
    if isinstance(artifact, ImageGrid):
        return [("images", stem + ".png", encode_png(image_pixels(artifact)))]
    if isinstance(artifact, VideoGrid):
        return [("videos", stem + ".gif", encode_gif(video_frames(artifact), artifact.fps))]
    if isinstance(artifact, TextSamples):
        return [
            ("text", stem + ".txt", artifact.to_text().encode()),
            ("text", stem + ".html", text_html(artifact, stem).encode()),
        ]
    if isinstance(artifact, TokenScores):
        return [
            ("scores", stem + ".html", token_scores_html(artifact, stem).encode()),
            ("scores", stem + ".png", encode_png(token_scores_pixels(artifact))),
        ]
    if isinstance(artifact, Representations):
        return [
            ("representations", stem + ".png", encode_png(representations_pixels(artifact, stem))),
            (
                "representations",
                stem + ".npz",
                encode_npz(features=artifact.features, labels=artifact.labels),
            ),
        ]
    return []
