"""NVlabs/edm's own data set format, read as its ``training/dataset.py`` ``ImageFolderDataset``
reads it, so FFHQ, AFHQv2, ImageNet-64 and CIFAR-10 prepared for NVlabs/edm train in dew as they
are.

The format (what its ``dataset_tool.py`` writes): a directory, or a ``.zip`` of one, holding image
files (any extension PIL knows; ``dataset_tool.py`` writes uncompressed PNGs) at any depth, and an
optional ``dataset.json`` at its root, ``{"labels": [[relative/name.png, class], ...]}`` or
``{"labels": null}``. Images are the files' sorted relative names; each is decoded with PIL as
``np.array(PIL.Image.open(file))`` (a 2-D greyscale image gains a channel axis), uint8, all the
same size. Labels are looked up by name; a class index ``c`` is the reference's one-hot row of
width ``max(c) + 1`` (dew keeps the index: ``label`` int32, ``num_classes = max(c) + 1``).

Rows follow the reference's ``Dataset`` (``dew.data.sources.image_rows.reference_rows``):
``max_size`` keeps a seeded subset, ``xflip`` doubles the set with mirrored copies. With
``cache`` (the reference's default in ``train.py``) every image is decoded once when the source
opens, on a pool of threads, and a batch is a gather from memory; without it, each batch is
decoded on the ``Dataset``'s background thread, two batches ahead of the step.

The format has one split: ``train`` is the set as configured (``max_size``, ``xflip``);
``validation`` is every stored image once, unmirrored, in stored order (the reference trains on
all of it and evaluates with FID against it, so there is nothing held out); it shares the
decoded table of an open ``train`` split.

Anything that is not such a data set stops with one line (``ImageFolderError``, a
``ConfigError``: exit status 2 from ``python -m dew.main``) naming the path and what would be
accepted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import weakref
import zipfile
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np

from dew import registry
from dew.data.dataset import Source
from dew.data.sources.image_rows import ImageRows, decode_all, reference_rows
from dew.schema import ConfigError, Declared, Key, Section, at_least

ACCEPTED = (
    "a directory or .zip of same-size images with an optional dataset.json, "
    "as NVlabs/edm's dataset_tool.py writes"
)
LABELS_FILE = "dataset.json"
#: PIL modes whose pixels ``np.array`` returns as uint8 (what the reference accepts).
EIGHT_BIT_MODES = frozenset({"L", "P", "LA", "PA", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "HSV"})
_BOMB = re.compile(r"Image size \((\d+) pixels\) exceeds limit of (\d+) pixels")


def bomb_refusal(where: str, error: Exception) -> str:
    """What PIL's ``DecompressionBombError`` for the image ``where`` names says to a person: its
    size in pixels, PIL's limit (``PIL.Image.MAX_IMAGE_PIXELS``) and what to do."""
    found = _BOMB.search(str(error))
    size = f"{int(found[1]):,} pixels, past PIL's limit of {int(found[2]):,}" if found else str(error)
    return (
        f"{where} is {size} (PIL.Image.MAX_IMAGE_PIXELS guards against decompression bombs); "
        "remove it or resize it"
    )


class ImageFolderError(ConfigError):
    """The path is not an NVlabs/edm data set, or not one that fits the options (one line)."""


class ImageBomb(ImageFolderError):
    """An image past PIL's decompression-bomb limit; ``pil_error`` is PIL's own error, for a
    caller that names the image its own way (``bomb_refusal``)."""

    def __init__(self, message: str, pil_error: Exception):
        super().__init__(message)
        self.pil_error = pil_error


class ImageFiles:
    """The files of a data set directory or zip: ``names`` (every file, relative, '/'-separated),
    ``images`` (the image files, sorted) and ``open(name)``. Safe to read from several threads
    (each thread opens its own handle on a zip)."""

    def __init__(
        self,
        path: str,
        *,
        suffixes: frozenset[str] | None = None,
        reader: str = "image_folder",
        accepted: str = ACCEPTED,
    ):
        """``suffixes``: the lower-case extensions that count as images (default: every one PIL
        knows); ``reader`` and ``accepted`` name the reader and the format in error lines."""
        import PIL.Image

        self.path = path
        self.reader = reader
        if not path:
            raise ImageFolderError(f"{reader}: no path given (config.dataset.path); expected {accepted}")
        if os.path.isdir(path):
            self.kind = "dir"
            self.names = {
                os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
                for root, _dirs, files in os.walk(path)
                for name in files
            }
        elif os.path.isfile(path) and os.path.splitext(path)[1].lower() == ".zip":
            self.kind = "zip"
            try:
                with zipfile.ZipFile(path) as archive:
                    self.names = set(archive.namelist())
            except zipfile.BadZipFile as e:
                raise ImageFolderError(
                    f"{reader}: {path!r} is not a readable zip ({e}); expected {accepted}"
                ) from None
        else:
            what = "does not exist" if not os.path.exists(path) else "is neither a directory nor a .zip"
            raise ImageFolderError(f"{reader}: {path!r} {what}; expected {accepted}")
        kinds = "image" if suffixes is None else "/".join(sorted(suffixes))
        if suffixes is None:
            PIL.Image.init()
            suffixes = frozenset(PIL.Image.EXTENSION)
        self.images = sorted(n for n in self.names if os.path.splitext(n)[1].lower() in suffixes)
        if not self.images:
            raise ImageFolderError(f"{reader}: {path!r} holds no {kinds} files; expected {accepted}")
        self._local = threading.local()

    def open(self, name: str) -> IO[bytes]:
        if self.kind == "dir":
            return open(os.path.join(self.path, name), "rb")
        archive = getattr(self._local, "zip", None)
        if archive is None:
            archive = self._local.zip = zipfile.ZipFile(self.path)
        return archive.open(name, "r")

    def decode(self, name: str) -> np.ndarray:
        """One image as uint8 [H, W, C], as the reference decodes it (PIL)."""
        import PIL.Image

        with self.open(name) as f, self.refusing_bombs(name):
            image = np.array(PIL.Image.open(f))
        if image.ndim == 2:
            image = image[:, :, np.newaxis]
        if image.dtype != np.uint8 or image.ndim != 3:
            raise ImageFolderError(
                f"image_folder: {self.path!r}: {name!r} decodes to {image.dtype} {image.shape}; "
                f"expected 8-bit greyscale or colour images ({ACCEPTED})"
            )
        return image

    @contextlib.contextmanager
    def refusing_bombs(self, name: str) -> Iterator[None]:
        """PIL's refusal of an image past its decompression-bomb limit
        (``PIL.Image.MAX_IMAGE_PIXELS``) as one ``ImageFolderError`` line naming the image."""
        import PIL.Image

        try:
            yield
        except PIL.Image.DecompressionBombError as e:
            where = os.path.join(self.path, name)
            raise ImageBomb(f"image_folder: {bomb_refusal(where, e)}", e) from None

    def header_shape(self, name: str) -> tuple[int, int, int]:
        """An image's [H, W, C] from its header alone (nothing decoded)."""
        import PIL.Image

        with self.open(name) as f, self.refusing_bombs(name), PIL.Image.open(f) as image:
            if image.mode not in EIGHT_BIT_MODES:
                raise ImageFolderError(
                    f"image_folder: {self.path!r}: {name!r} has PIL mode {image.mode!r}; expected 8-bit "
                    f"greyscale or colour images ({ACCEPTED})"
                )
            width, height = image.size
            return height, width, len(image.getbands())


def check_shape(files: ImageFiles, name: str, shape: Sequence[int], expected: Sequence[int]) -> None:
    if tuple(shape) != tuple(expected):
        size = "x".join(str(s) for s in shape)
        first = "x".join(str(s) for s in expected)
        raise ImageFolderError(
            f"image_folder: {files.path!r}: {name!r} is {size} (HxWxC) but {files.images[0]!r} is {first}; "
            f"every image must have the same size and channels (dataset_tool.py --resolution makes them so)"
        )


def read_labels(files: ImageFiles) -> np.ndarray | None:
    """Each image's class index (int64, in ``files.images`` order), or None when the set is
    unlabelled (no ``dataset.json``, or ``"labels": null``)."""
    if LABELS_FILE not in files.names:
        return None
    where = f"{files.reader}: {files.path!r}: {LABELS_FILE}"
    try:
        with files.open(LABELS_FILE) as f:
            labels = json.load(f)["labels"]
        if labels is None:
            return None
        table = {str(name): value for name, value in labels}
    except (ValueError, KeyError, TypeError) as e:
        raise ImageFolderError(
            f'{where} is not {{"labels": [[name, class], ...] or null}} ({type(e).__name__}: {e})'
        ) from None
    missing = [name for name in files.images if name not in table]
    if missing:
        raise ImageFolderError(
            f"{where} has no label for {missing[0]!r} ({len(missing)} of {len(files.images)} images "
            f"unlabelled); expected one [name, class] pair per image"
        )
    values = np.array([table[name] for name in files.images])
    if values.ndim != 1 or values.dtype.kind not in "iu" or values.min() < 0:
        raise ImageFolderError(
            f"{where}: labels must be class indices (ints >= 0), got {values.dtype} {values.shape[1:]} "
            f"values; dew conditions on class indices (vector labels are not supported)"
        )
    return values.astype(np.int64)


#: Decoded tables of open sources, by (path, size, mtime), so a run's two splits decode once.
_TABLES: weakref.WeakValueDictionary[tuple[Any, ...], np.ndarray] = weakref.WeakValueDictionary()


def _decoded_table(files: ImageFiles, shape: tuple[int, int, int]) -> np.ndarray:
    stat = os.stat(files.path)
    key = (os.path.realpath(files.path), stat.st_size, stat.st_mtime_ns, len(files.images))
    table = _TABLES.get(key)
    if table is None:

        def read_one(i: int) -> np.ndarray:
            image = files.decode(files.images[i])
            check_shape(files, files.images[i], image.shape, shape)
            return image

        table = decode_all(len(files.images), read_one, shape)
        _TABLES[key] = table
    return table


def image_folder(
    split: str = "train",
    *,
    path: str = "",
    use_labels: bool = False,
    xflip: bool = False,
    cache: bool = True,
    max_size: int | None = None,
    max_size_seed: int = 0,
    resolution: int | None = None,
) -> Source:
    """The data set at ``path`` (module docstring) as a ``Source`` of ``image`` (float32
    [rows, H, W, C] in [-1, 1]) and, with ``use_labels``, ``label`` (int32 class indices)."""
    if split not in ("train", "validation"):
        raise ValueError(f"image_folder: split must be 'train' or 'validation', got {split!r}")
    files = ImageFiles(path)
    shape = files.decode(files.images[0]).shape
    height, width, _ = shape
    if height != width:
        raise ImageFolderError(
            f"image_folder: {path!r}: images are {height}x{width}; "
            f"expected square images (as dataset_tool.py writes)"
        )
    if resolution is not None and height != resolution:
        raise ImageFolderError(
            f"image_folder: {path!r}: images are {height}x{width}, config.dataset.resolution={resolution}; "
            f"expected the two to agree (or resolution=None)"
        )
    labels = read_labels(files) if use_labels else None
    if use_labels and labels is None:
        raise ImageFolderError(
            f"image_folder: {path!r} has no labels (no {LABELS_FILE}, or its 'labels' is null) but "
            f"use_labels=True; expected use_labels=False, or a {LABELS_FILE} with one [name, class] "
            f"pair per image"
        )
    if split == "train":
        raw_index, mirrored = reference_rows(
            len(files.images), max_size=max_size, seed=max_size_seed, xflip=xflip
        )
    else:
        raw_index, mirrored = reference_rows(len(files.images))
    if cache:
        pixels: Any = _decoded_table(files, shape)
    else:
        for name in files.images[1:]:  # headers only: a mixed set fails here, not mid-run
            check_shape(files, name, files.header_shape(name), shape)

        def read_rows(raw: np.ndarray) -> np.ndarray:
            images = [files.decode(files.images[i]) for i in raw]
            for i, image in zip(raw, images, strict=True):
                check_shape(files, files.images[i], image.shape, shape)
            return np.stack(images) if images else np.empty((0, *shape), np.uint8)

        pixels = read_rows

    fields: dict[str, Any] = {"image": ImageRows(pixels, raw_index, mirrored, shape=shape)}
    num_classes = None
    if labels is not None:
        fields["label"] = labels[raw_index].astype(np.int32)
        num_classes = int(labels.max()) + 1
    name = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    return Source(name=f"{name}/{split}", fields=fields, num_classes=num_classes, prefetch=0 if cache else 2)


def _config_section() -> Section:
    return Section(
        "an NVlabs/edm data set (dataset_tool.py's zip or directory of PNGs + dataset.json)",
        {
            "path": Key("", "the data set: a .zip or a directory, as NVlabs/edm's dataset_tool.py writes it"),
            "use_labels": Key(False, "read class labels from dataset.json (the reference's --cond)"),
            "xflip": Key(False, "double the set with left-right mirrored copies (the reference's --xflip)"),
            "cache": Key(True, "decode every image once when opening and keep them in memory (--cache)"),
            "max_size": Key(
                None,
                "keep a seeded random subset of this many images (None: all)",
                kind=int,
                **at_least(1, "None or an int >= 1"),
            ),
            "max_size_seed": Key(0, "the seed of max_size's subset (the reference's random_seed)"),
            "resolution": Key(
                None,
                "refuse images of another size (None: any)",
                kind=int,
                **at_least(1, "None or an int >= 1"),
            ),
        },
    )


registry.datasets.register("image_folder", Declared(image_folder, _config_section))
