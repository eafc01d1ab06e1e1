"""dew trains on latent data sets that NVlabs/edm2's own ``dataset_tool.py encode`` wrote.

The golden (``third_party/edm2/make_latent_dataset_reference.py``): a zip written with edm2's own
writer, in unsorted order over three folder prefixes, and the arrays and labels edm2's own
``ImageFolderDataset`` reads back from it. dew reads the same zip, the same extracted to a
directory (neither has dew's ``encode.json``), and gives exactly edm2's values, in edm2's order,
as NHWC rows.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from dew.data.sources.latent_dataset import LatentDatasetError, open_latent_dataset
from dew.data.sources.latent_source import latent_dataset
from dew.schema import ConfigError

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "third_party", "edm2")
ZIP = os.path.join(REFERENCE, "latent_dataset_reference.zip")


@pytest.fixture(scope="module")
def golden():
    with np.load(os.path.join(REFERENCE, "latent_dataset_reference.npz")) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture
def extracted(tmp_path):
    with zipfile.ZipFile(ZIP) as archive:
        archive.extractall(tmp_path / "latents")
    return str(tmp_path / "latents")


@pytest.mark.parametrize("form", ["zip", "directory"])
def test_edm2s_own_encoded_set_reads_as_edm2_reads_it(form, golden, extracted):
    path = ZIP if form == "zip" else extracted
    rows, labels = open_latent_dataset(path)
    assert rows.files.images == list(golden["names"])
    nhwc = golden["images"].transpose(0, 2, 3, 1)
    assert rows.shape == nhwc.shape and rows.dtype == np.float32
    np.testing.assert_array_equal(rows[np.arange(len(rows))], nhwc)  # bytes as stored: exact
    np.testing.assert_array_equal(rows[3], nhwc[3])
    np.testing.assert_array_equal(labels, golden["labels"])


@pytest.mark.parametrize("cache", [True, False])
def test_the_training_source_takes_an_edm2_zip(cache, golden):
    source = latent_dataset("train", path=ZIP, use_labels=True, cache=cache)
    image, label = source.fields["image"], source.fields["label"]
    np.testing.assert_array_equal(image[np.arange(len(image))], golden["images"].transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(label, golden["labels"].astype(np.int32))
    assert source.num_classes == int(golden["labels"].max()) + 1


def _zip(path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return str(path)


def _npy(a: np.ndarray) -> bytes:
    import io

    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


def test_an_unlabelled_edm2_set_reads_without_labels(tmp_path, golden, extracted):
    with open(os.path.join(extracted, "dataset.json"), "w") as f:
        json.dump({"labels": None}, f)
    rows, labels = open_latent_dataset(extracted)
    assert labels is None and len(rows) == len(golden["names"])
    os.remove(os.path.join(extracted, "dataset.json"))  # edm2 reads a set without one as unlabelled
    assert open_latent_dataset(extracted)[1] is None
    with pytest.raises(ConfigError, match="holds no labels"):
        latent_dataset("train", path=extracted, use_labels=True)


def test_bad_edm2_sets_are_one_line_naming_the_path_and_what_is_accepted(tmp_path, extracted):
    no_npy = _zip(tmp_path / "pngs.zip", {"00000/img00000000.png": b"x", "dataset.json": b'{"labels": null}'})
    with pytest.raises(
        LatentDatasetError, match=r"pngs\.zip' holds no \.npy files; expected a directory or \.zip"
    ):
        open_latent_dataset(no_npy)

    mixed = _zip(
        tmp_path / "mixed.zip",
        {
            "00000/a.npy": _npy(np.zeros((8, 4, 4), np.float32)),
            "00000/b.npy": _npy(np.zeros((8, 2, 2), np.float32)),
        },
    )
    rows, _ = open_latent_dataset(mixed)
    with pytest.raises(LatentDatasetError, match=r"'00000/b\.npy' holds float32 8x2x2; expected float 8x4x4"):
        rows[1]

    integers = _zip(tmp_path / "ints.zip", {"a.npy": _npy(np.zeros((8, 4, 4), np.int32))})
    with pytest.raises(LatentDatasetError, match="holds int32 8x4x4; expected a float"):
        open_latent_dataset(integers)

    not_a_zip = tmp_path / "broken.zip"
    not_a_zip.write_bytes(b"not a zip")
    with pytest.raises(LatentDatasetError, match="is not a readable zip"):
        open_latent_dataset(str(not_a_zip))

    name = sorted(os.listdir(os.path.join(extracted, "00100")))[0]
    os.remove(os.path.join(extracted, "00100", name))  # its label stays: edm2 looks labels up by name
    rows, labels = open_latent_dataset(extracted)
    assert labels is not None and len(rows) == len(labels) == 5 and f"00100/{name}" not in rows.files.images
    shutil.move(os.path.join(extracted, "00000"), os.path.join(extracted, "moved"))
    with pytest.raises(
        LatentDatasetError, match=r"dataset\.json has no label for 'moved/img-mean-std-00000000\.npy'"
    ):
        open_latent_dataset(extracted)

    with pytest.raises(ConfigError, match=r"config\.dataset\.path='.*broken\.zip'"):
        latent_dataset("train", path=str(not_a_zip))
