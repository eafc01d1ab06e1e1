"""The one reader of image files that ``python -m dew.fid`` scores (``--images``, a folder
``--ref``, ADM's folder reference): a folder listed (``list_images``), its images decoded in
batches (``read_images``; a folder reference's images: ``FolderImages``, read as a reference
batch's ``arr_0`` is) and its resolution (``image_resolution``), every refusal one
``FidInputError`` line naming the file and what is wrong.

Images are PNG/JPEG/BMP/WebP files of one size, decoded by PIL as RGB (pytorch-fid's reading,
which batches them, so every image must have the first one's size) and given as float32 in
[0, 1] or, for ADM's evaluator, as the uint8 pixels themselves. A file PIL refuses (past its
decompression-bomb limit, not an image, truncated) is refused by ``decode_image``, which NVlabs
data sets' reader (``dew.scoring.fid_reference.dataset_batches``) shares.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")  # what a decode callable gives back (pixels, or a size)

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


class FidInputError(ValueError):
    """Input the FID protocol cannot use (one line naming the flag, the value and what would do)."""


def decode_image(decode: Callable[[], T], where: str) -> T:
    """``decode()`` (a PIL decode of the image ``where`` names), with what PIL refuses as one
    ``FidInputError`` line naming the image: past PIL's decompression-bomb limit (its size in
    pixels and the limit, ``PIL.Image.MAX_IMAGE_PIXELS``), not an image, or truncated."""
    import PIL.Image

    try:
        return decode()
    except PIL.Image.DecompressionBombError as e:
        from dew.data.sources.image_folder import bomb_refusal

        raise FidInputError(bomb_refusal(where, e)) from None
    except (PIL.UnidentifiedImageError, OSError, SyntaxError) as e:
        raise FidInputError(
            f"{where} cannot be decoded as an image ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
        ) from None


def list_images(folder: str, what: str) -> list[str]:
    """The image files (``EXTENSIONS``, any case) in ``folder``, sorted, at least two;
    ``FidInputError`` naming the flag ``what`` otherwise."""
    if not os.path.isdir(folder):
        raise FidInputError(f"{what}={folder!r} is not a folder of images")
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith(EXTENSIONS))
    if len(files) < 2:
        raise FidInputError(
            f"{what}={folder!r} holds {len(files)} images ({'/'.join(EXTENSIONS)}); need at least 2"
        )
    return files


def read_images(files: Sequence[str], batch_size: int, *, uint8: bool = False) -> Iterator[np.ndarray]:
    """The images of ``files`` in order, ``batch_size`` at a time: [n, H, W, 3] float32 in [0, 1]
    (the 8-bit pixels / 255), or with ``uint8`` the pixels themselves (ADM's evaluator's batches).
    Every image must have the first one's size; ``FidInputError`` naming the file otherwise."""
    from PIL import Image

    def decode(path: str) -> np.ndarray:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"), np.uint8)

    size = None
    for i in range(0, len(files), batch_size):
        batch = []
        for path in files[i : i + batch_size]:
            array = decode_image(functools.partial(decode, path), path)
            if size is None:
                size = array.shape
            elif array.shape != size:
                raise FidInputError(
                    f"{path} is {array.shape[1]}x{array.shape[0]}, the first image {size[1]}x{size[0]}"
                )
            batch.append(array)
        pixels = np.stack(batch)
        yield pixels if uint8 else pixels.astype(np.float32) / np.float32(255.0)


@dataclasses.dataclass(frozen=True)
class FolderImages:
    """A listed folder's ``files`` as a reference's images: uint8 [n, H, W, 3] ``batch`` at a time
    (``read_images``), as ``adm_evaluator.ImageBatches`` reads a reference batch's ``arr_0``;
    ``len`` is the image count."""

    files: Sequence[str]

    def __len__(self) -> int:
        return len(self.files)

    def batches(self, batch: int) -> Iterator[np.ndarray]:
        return read_images(self.files, batch, uint8=True)


def image_resolution(files: Sequence[str]) -> tuple[int, int]:
    """[H, W] of the first of ``files`` (its header read, as ``read_images`` would decode it)."""
    from PIL import Image

    def size() -> tuple[int, int]:
        with Image.open(files[0]) as image:
            return image.size[1], image.size[0]

    return decode_image(size, files[0])


__all__ = [
    "EXTENSIONS",
    "FidInputError",
    "FolderImages",
    "decode_image",
    "image_resolution",
    "list_images",
    "read_images",
]
