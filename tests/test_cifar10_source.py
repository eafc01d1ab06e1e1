"""``cifar10``: tfds's CIFAR-10 (``tfds.data_source``, no TensorFlow) laid out as NVlabs/edm trains
on it, tested on ``tfds.testing.mock_data``: the records' pixels and labels, x-flip as the
reference's ``Dataset`` does it, a cached set that reads nothing after opening, resumable
positions, and the uncached path giving the same batches."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import dew
from dew.data import Dataset

tfds = pytest.importorskip("tensorflow_datasets")
COUNT = 24


@pytest.fixture
def mock_cifar10():
    with tfds.testing.mock_data(num_examples=COUNT):
        records = tfds.data_source("cifar10", split="train")
        images = np.stack([np.asarray(records[i]["image"]) for i in range(COUNT)])
        labels = np.array([int(records[i]["label"]) for i in range(COUNT)])
        yield images, labels


def test_rows_are_the_records_then_their_mirrors(mock_cifar10):
    images, labels = mock_cifar10
    assert images.shape == (COUNT, 32, 32, 3) and images.dtype == np.uint8
    source = dew.datasets["cifar10"]("train", use_labels=True, xflip=True)
    assert len(source) == 2 * COUNT and source.num_classes == 10 and source.name == "cifar10/train"
    image = source.fields["image"]
    assert image.cached and source.prefetch == 0
    rows = np.arange(2 * COUNT)
    mirrored = images[:, :, ::-1, :]  # the reference's image[:, :, ::-1] on CHW: left-right
    assert not np.array_equal(mirrored, images)
    np.testing.assert_array_equal(image.uint8(rows), np.concatenate([images, mirrored]))
    want = np.concatenate([images, mirrored]).astype(np.float32) / np.float32(127.5) - np.float32(1)
    np.testing.assert_array_equal(image[rows], want)
    np.testing.assert_array_equal(source.fields["label"], np.concatenate([labels, labels]))
    assert "label" not in dew.datasets["cifar10"]("train").fields  # use_labels=False: unconditional
    validation = dew.datasets["cifar10"]("validation", xflip=True)  # tfds "test", never mirrored
    assert len(validation) == COUNT and validation.name == "cifar10/validation"
    assert "tensorflow" not in sys.modules


def test_cached_batches_read_nothing_resume_exactly_and_match_uncached(mock_cifar10, monkeypatch):
    cached = dew.datasets["cifar10"]("train", use_labels=True, xflip=True)
    lazy = dew.datasets["cifar10"]("train", use_labels=True, xflip=True, cache=False)
    assert not lazy.fields["image"].cached and lazy.prefetch == 2
    reference = Dataset(lazy, 8, seed=1, prefetch=0)
    expected = [next(reference) for _ in range(8)]  # 6 batches an epoch: crosses into epoch 1
    from tensorflow_datasets.core.data_sources import array_record

    def no_reads(*args, **kwargs):
        raise AssertionError("read a record after the cached source opened")

    monkeypatch.setattr(array_record.ArrayRecordDataSource, "__getitem__", no_reads)
    with pytest.raises(AssertionError, match="read a record"):
        lazy.fields["image"][np.arange(2)]  # the patch does stop reads
    straight = Dataset(cached, 8, seed=1)
    for want in expected[:3]:
        got = next(straight)
        np.testing.assert_array_equal(got["image"], want["image"])
        np.testing.assert_array_equal(got["label"], want["label"])
    resumed = Dataset(cached, 8, seed=1)
    resumed.read_position(straight.save_position())
    for want in expected[3:]:
        got = next(resumed)
        np.testing.assert_array_equal(got["image"], want["image"])
        np.testing.assert_array_equal(got["label"], want["label"])


def test_an_unprepared_cifar10_says_how_to_prepare_it(tmp_path):
    from dew.data.sources.tfds_source import DatasetNotPreparedError

    with pytest.raises(DatasetNotPreparedError, match="'cifar10' is not prepared in array_record format"):
        dew.datasets["cifar10"]("train", data_dir=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="split must be one of"):
        dew.datasets["cifar10"]("test")
