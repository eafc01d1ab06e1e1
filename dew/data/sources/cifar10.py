"""CIFAR-10 through tensorflow-datasets (``tfds.data_source('cifar10')``, array_record, no
TensorFlow), laid out as NVlabs/edm trains on it.

NVlabs/edm trains on the 50,000 training images at 32x32 (its ``dataset_tool.py`` copies them
unchanged from the CIFAR-10 python archive), caches them in memory (``train.py --cache``, on by
default) and, with ``--xflip``, doubles the set with mirrored copies. Here the ``train`` split is
tfds's ``train`` (the same 50,000 images and labels) and ``validation`` is tfds's ``test``
(10,000, unmirrored). Images are float32 [rows, 32, 32, 3] in [-1, 1] (``u8 / 127.5 - 1``);
``label`` (with ``use_labels``, the reference's ``--cond``) is the class index, 10 classes.

With ``cache`` every record is read and decoded once when the source opens (on a pool of
threads) and a batch is a gather from memory, with nothing decoded on the step's path; without
it, a batch is read and decoded on the ``Dataset``'s background thread, two batches ahead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dew import registry
from dew.data.dataset import Source
from dew.data.sources.image_rows import ImageRows, decode_all, reference_rows
from dew.data.sources.tfds_source import _RowReader, open_records

SHAPE = (32, 32, 3)
NUM_CLASSES = 10
SPLITS = {"train": "train", "validation": "test"}


def _record(records: Any, i: int) -> dict[str, np.ndarray | np.generic]:
    record = records[i]
    image = np.asarray(record["image"])
    if image.shape != SHAPE or image.dtype != np.uint8:
        raise ValueError(
            f"cifar10: record {i} holds a {image.dtype} {image.shape} image; expected uint8 {SHAPE}"
        )
    return {"image": image, "label": np.int32(record["label"])}


class _Labels:
    """The ``label`` field of uncached rows: read with the images of the same rows (one read)."""

    def __init__(self, reader: _RowReader, raw_index: np.ndarray):
        self._reader, self._raw = reader, raw_index
        self.shape, self.dtype = (raw_index.size,), np.dtype(np.int32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: Any) -> np.ndarray:
        return self._reader.read(self._raw[np.arange(self.shape[0])[rows]])["label"]


def cifar10(
    split: str = "train",
    *,
    data_dir: str = "",
    use_labels: bool = False,
    xflip: bool = False,
    cache: bool = True,
) -> Source:
    """The ``train`` (50,000; doubled by ``xflip``) or ``validation`` (tfds ``test``, 10,000)
    split of CIFAR-10 as a ``Source`` of ``image`` and, with ``use_labels``, ``label``."""
    if split not in SPLITS:
        raise ValueError(f"cifar10: split must be one of {sorted(SPLITS)}, got {split!r}")
    records = open_records("cifar10", SPLITS[split], data_dir or None)
    count = len(records)
    raw_index, mirrored = reference_rows(count, xflip=xflip and split == "train")
    fields: dict[str, Any] = {}
    if cache:
        labels = np.empty(count, np.int32)

        def read_one(i: int) -> np.ndarray:
            record = _record(records, i)
            labels[i] = record["label"]
            return np.asarray(record["image"])  # (already an array)

        fields["image"] = ImageRows(decode_all(count, read_one, SHAPE), raw_index, mirrored)
        if use_labels:
            fields["label"] = labels[raw_index]
    else:

        class _Records:  # what _RowReader reads: decoded, checked records by index
            def __getitem__(self, i: int) -> dict[str, np.ndarray | np.generic]:
                return _record(records, int(i))

        reader = _RowReader(_Records(), count)
        fields["image"] = ImageRows(lambda raw: reader.read(raw)["image"], raw_index, mirrored, shape=SHAPE)
        if use_labels:
            fields["label"] = _Labels(reader, raw_index)
    return Source(
        name=f"cifar10/{split}",
        fields=fields,
        num_classes=NUM_CLASSES if use_labels else None,
        prefetch=0 if cache else 2,
    )


registry.datasets.register("cifar10", cifar10)
