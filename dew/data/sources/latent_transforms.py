"""NVlabs/edm2 ``dataset_tool.py convert``'s crop and resize (``--transform``, ``--resolution``),
for the encode command (``python -m dew.data.sources.latent_dataset --transform=...``).

EDM2 prepares ImageNet-512 in two steps: ``dataset_tool.py convert --resolution=512x512
--transform=center-crop-dhariwal`` writes the resized images as lossless PNGs, then
``dataset_tool.py encode`` runs the VAE on them unchanged. ``make_transform`` is ``convert``'s
per-image function, the same PIL calls in the same order, so encoding with a transform gives
the latents of encoding ``convert``'s output (PNG is lossless):

- no transform (``scale``): ``resize((W, H), LANCZOS)`` unless the image already is W×H;
- ``center-crop``: the centred min(H, W) square, then ``resize((W, H), LANCZOS)``;
- ``center-crop-wide``: the centred rows of height round(W·h/w), ``resize((W, H), LANCZOS)``,
  pasted into the middle rows of a black W×W canvas; ``None`` (``convert`` skips the image) when
  the image is narrower than W or that height is below H;
- ``center-crop-dhariwal`` (ADM's, guided-diffusion ``center_crop_arr``; W must equal H):
  halve with ``BOX`` while the short side is ≥ 2·W, resize by W / short side (sides rounded) with
  ``BICUBIC``, then the centred W×W crop.

Images are opened as edm2 opens them, ``PIL.Image.open(f).convert('RGB')`` (``load_rgb``).
``tests/test_latent_transforms.py`` checks every mode against the reference's own outputs
(``third_party/edm2/transform_reference.npz``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import IO

import numpy as np

TRANSFORMS = ("center-crop", "center-crop-wide", "center-crop-dhariwal")
"""``--transform`` choices, as ``dataset_tool.py convert`` names them (none: plain scaling)."""

Transform = Callable[[np.ndarray], "np.ndarray | None"]


def parse_resolution(text: str) -> tuple[int, int]:
    """``'512x512'`` → (512, 512) as (width, height); ``ValueError`` naming the value otherwise."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--resolution={text!r} is invalid: expected WxH with positive ints (e.g. 512x512)")
    return int(parts[0]), int(parts[1])


def load_rgb(f: IO[bytes]) -> np.ndarray:
    """An image file as uint8 [H, W, 3], as ``dataset_tool.py`` reads it (``convert('RGB')``)."""
    import PIL.Image

    return np.array(PIL.Image.open(f).convert("RGB"))


def _scale(width: int | None, height: int | None, img: np.ndarray) -> np.ndarray:
    import PIL.Image

    h, w = img.shape[:2]
    if width == w and height == h:
        return img
    out = PIL.Image.fromarray(img, "RGB")
    ww = width if width is not None else w
    hh = height if height is not None else h
    return np.array(out.resize((ww, hh), PIL.Image.Resampling.LANCZOS))


def _center_crop(width: int, height: int, img: np.ndarray) -> np.ndarray:
    import PIL.Image

    crop = np.min(img.shape[:2])
    img = img[
        (img.shape[0] - crop) // 2 : (img.shape[0] + crop) // 2,
        (img.shape[1] - crop) // 2 : (img.shape[1] + crop) // 2,
    ]
    out = PIL.Image.fromarray(img, "RGB")
    return np.array(out.resize((width, height), PIL.Image.Resampling.LANCZOS))


def _center_crop_wide(width: int, height: int, img: np.ndarray) -> np.ndarray | None:
    import PIL.Image

    ch = int(np.round(width * img.shape[0] / img.shape[1]))
    if img.shape[1] < width or ch < height:
        return None
    img = img[(img.shape[0] - ch) // 2 : (img.shape[0] + ch) // 2]
    out = np.array(PIL.Image.fromarray(img, "RGB").resize((width, height), PIL.Image.Resampling.LANCZOS))
    canvas = np.zeros([width, width, 3], dtype=np.uint8)
    canvas[(width - height) // 2 : (width + height) // 2, :] = out
    return canvas


def _center_crop_dhariwal(image_size: int, arr: np.ndarray) -> np.ndarray:
    import PIL.Image

    image = PIL.Image.fromarray(arr)
    while min(*image.size) >= 2 * image_size:
        image = image.resize((image.size[0] // 2, image.size[1] // 2), resample=PIL.Image.Resampling.BOX)
    scale = image_size / min(*image.size)
    size = (round(image.size[0] * scale), round(image.size[1] * scale))
    image = image.resize(size, resample=PIL.Image.Resampling.BICUBIC)
    out = np.array(image)
    crop_y = (out.shape[0] - image_size) // 2
    crop_x = (out.shape[1] - image_size) // 2
    return out[crop_y : crop_y + image_size, crop_x : crop_x + image_size]


def skips(transform: str | None, width: int | None, height: int | None, size: tuple[int, int]) -> bool:
    """Whether ``make_transform(transform, width, height)`` returns None for an image of
    ``size`` = (height, width): ``center-crop-wide``'s rule, decidable from the header alone."""
    if transform != "center-crop-wide":
        return False
    if width is None or height is None:
        raise ValueError(f"--transform={transform} needs --resolution=WxH")  # as make_transform says
    h, w = size
    return w < width or int(np.round(width * h / w)) < height


def make_transform(transform: str | None, width: int | None, height: int | None) -> Transform:
    """``dataset_tool.py``'s ``make_transform``: uint8 [H, W, 3] → the converted image, or None
    where ``convert`` would skip it. ``ValueError`` (naming the flag, the value and what is
    accepted) for an unknown mode or a missing / non-square resolution."""
    if transform is None:
        return functools.partial(_scale, width, height)
    if transform not in TRANSFORMS:
        raise ValueError(f"--transform={transform!r} is invalid: expected one of {TRANSFORMS} (or none)")
    if width is None or height is None:
        raise ValueError(f"--transform={transform} needs --resolution=WxH")
    if transform == "center-crop":
        return functools.partial(_center_crop, width, height)
    if transform == "center-crop-wide":
        return functools.partial(_center_crop_wide, width, height)
    if width != height:
        raise ValueError(
            f"--transform=center-crop-dhariwal with --resolution={width}x{height}: expected W equal to H"
        )
    return functools.partial(_center_crop_dhariwal, width)


__all__ = ["TRANSFORMS", "load_rgb", "make_transform", "parse_resolution", "skips"]
