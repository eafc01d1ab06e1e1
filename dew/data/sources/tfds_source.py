"""tensorflow-datasets by name, without TensorFlow: ``tfds.data_source`` (array_record random
access) read through a grain ``MapDataset`` that decodes, crops and resizes each record.

The result is a ``Source`` whose columns are read lazily, one batch of rows at a time, so
``Dataset`` shuffles, shares and resumes it exactly as it does in-memory arrays (its position
stays the JSON (epoch, batch) pair). Images are centre-cropped to a square, resized to
``resolution`` (bilinear, pixel-area aligned) and mapped from uint8 to [-1, 1].

Nothing is downloaded here (there is no network at run time): a data set must be prepared once,
in array_record format, under ``data_dir``; otherwise ``DatasetNotPreparedError`` says how.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dew import registry
from dew.data.dataset import Source
from dew.schema import ConfigError


class DatasetNotPreparedError(ConfigError):
    """A tfds data set that has no prepared array_record copy where it was looked for. A
    ``ConfigError``, so ``python -m dew.main`` prints the how-to instead of a stack trace."""


def _prepare_hint(name: str, data_dir: str | None) -> str:
    where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    return (
        f"tfds data set {name!r} is not prepared in array_record format under {where!r}. "
        f"Prepare it once on a machine with network access:\n"
        f'  python -c "import tensorflow_datasets as tfds; tfds.builder({name!r}, data_dir={where!r}, '
        f"file_format='array_record').download_and_prepare()\"\n"
        f"then copy that directory here and pass it as data_dir (config.dataset.data_dir) "
        f"or set TFDS_DATA_DIR."
    )


def centre_crop_resize(image: np.ndarray, resolution: int) -> np.ndarray:
    """uint8 [H, W, C] -> float32 [resolution, resolution, C] in [-1, 1]."""
    from scipy import ndimage

    h, w = image.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    square = image[top : top + side, left : left + side].astype(np.float32)
    if side != resolution:
        scale = resolution / side
        square = ndimage.zoom(square, (scale, scale, 1), order=1, mode="nearest", grid_mode=True)
    return (np.asarray(square) / 127.5 - 1.0).clip(-1.0, 1.0).astype(np.float32)


class _RowReader:
    """Reads rows through the grain dataset, remembering the last rows so that every column of
    one batch comes from a single read. Safe to call from several threads (a ``Dataset``'s
    prefetch thread and the evaluation prefix)."""

    def __init__(self, dataset: Any, size: int):
        self.dataset, self.size = dataset, size
        self._last: tuple[tuple[int, ...], dict[str, np.ndarray]] | None = None
        self._lock = threading.Lock()

    def read(self, rows: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        key = tuple(int(r) for r in np.asarray(rows).reshape(-1))
        with self._lock:
            if self._last is None or self._last[0] != key:
                records = [self.dataset[r] for r in key]
                self._last = (key, {k: np.stack([rec[k] for rec in records]) for k in records[0]})
            return self._last[1]


class _Column:
    """One lazily read field: ``shape``, ``dtype``, ``len`` and ``column[rows]`` like an array."""

    def __init__(self, reader: _RowReader, key: str, shape: tuple[int, ...], dtype: npt.DTypeLike):
        self._reader, self._key = reader, key
        self.shape, self.dtype = (reader.size, *shape), np.dtype(dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: Any) -> np.ndarray:
        index = np.asarray(rows)
        if index.dtype.kind not in "iu":  # a slice, a mask, ...: resolve it against the row range
            index = np.arange(self.shape[0])[rows]
        elif index.size and (index.min() < -self.shape[0] or index.max() >= self.shape[0]):
            raise IndexError(f"rows out of range for a column of {self.shape[0]} rows")
        return self._reader.read(index % self.shape[0])[self._key]


def open_records(name: str, split: str, data_dir: str | None) -> Any:
    """``tfds.data_source(name, split=split)`` read from ``data_dir`` (None or "": tfds's
    default), never downloading; an unknown name is a ``ValueError``, an unprepared one a
    ``DatasetNotPreparedError`` saying how to prepare it."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.registered import DatasetNotFoundError

    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # an unprepared folder is reported below, in one line
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
    except DatasetNotFoundError as e:
        raise ValueError(f"tfds_source: no tfds data set named {name!r} ({e})") from None
    except (NotImplementedError, AssertionError, FileNotFoundError, KeyError) as e:
        # KeyError: a folder without generated splits ("`splits` is empty").
        raise DatasetNotPreparedError(_prepare_hint(name, data_dir)) from e
    finally:
        absl_logger.setLevel(level)


def tfds_source(
    name: str,
    split: str = "train",
    *,
    resolution: int = 64,
    data_dir: str | None = None,
    image_key: str = "image",
    label_key: str | None = "label",
) -> Source:
    """The ``split`` of tfds data set ``name`` as a lazily read ``Source`` of ``image`` (and
    ``label`` when ``label_key`` is set), images ``resolution`` square in [-1, 1]."""
    import grain

    if resolution < 1:
        raise ValueError(f"tfds_source({name!r}): resolution must be >= 1, got {resolution}")
    records = open_records(name, split, data_dir)
    num_classes = None
    if label_key is not None:
        num_classes = int(records.dataset_info.features[label_key].num_classes)

    def decode(record: dict[str, Any]) -> dict[str, np.ndarray | np.generic]:
        image = np.asarray(record[image_key])
        if image.ndim == 2:
            image = image[..., None]
        out: dict[str, np.ndarray | np.generic] = {"image": centre_crop_resize(image, resolution)}
        if label_key is not None:
            out["label"] = np.int32(record[label_key])
        return out

    dataset = grain.MapDataset.source(records).map(decode)
    reader = _RowReader(dataset, len(records))
    channels = int(records.dataset_info.features[image_key].shape[-1] or 3)
    fields: dict[str, Any] = {
        "image": _Column(reader, "image", (resolution, resolution, channels), np.float32)
    }
    if label_key is not None:
        fields["label"] = _Column(reader, "label", (), np.int32)
    # Decoding and resizing run on a Dataset's background thread, two batches ahead of the step.
    return Source(name=f"{name}/{split}", fields=fields, num_classes=num_classes, prefetch=2)


def named(name: str, **defaults: Any) -> Callable[..., Source]:
    """A ``dew.datasets`` entry for tfds data set ``name``: ``factory(split, **options)``."""
    return functools.partial(tfds_source, name, **defaults)


registry.datasets.register("oxford_flowers102", named("oxford_flowers102"))
