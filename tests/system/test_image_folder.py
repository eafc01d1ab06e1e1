"""``image_folder``: NVlabs/edm's data set format, checked against what the reference's own
``ImageFolderDataset`` returned for archives its own ``dataset_tool.py`` wrote
(``third_party/edm/make_dataset_reference.py``), in zip and folder form, cached and not; and bad
input, one line and exit status 2 from ``python -m dew.main``."""

from __future__ import annotations

import pathlib
import zipfile

import numpy as np
import PIL.Image
import pytest

import dew
from dew.data import DataPartition, Dataset
from dew.data.sources import image_folder as image_folder_module
from dew.data.sources.image_folder import ImageFolderError
from dew.data.sources.image_rows import reference_rows

ROOT = pathlib.Path(__file__).resolve().parents[2]
EDM_DIR = ROOT / "third_party" / "edm"
RGB_ZIP = EDM_DIR / "dataset_rgb_labels.zip"
GRAY_ZIP = EDM_DIR / "dataset_gray_unlabelled.zip"
EDM = str(ROOT / "experiments" / "edm.py")


@pytest.fixture(scope="module")
def golden():
    with np.load(EDM_DIR / "dataset_reference.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _hwc(chw: np.ndarray) -> np.ndarray:
    return chw.transpose(0, 2, 3, 1)


def _extracted(zip_path: pathlib.Path, where: pathlib.Path) -> pathlib.Path:
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(where)
    return where


def _open(path, **options):
    return dew.datasets["image_folder"]("train", path=str(path), **options)


@pytest.mark.parametrize("form", ["zip", "folder"])
@pytest.mark.parametrize("cache", [True, False])
def test_rows_images_and_labels_are_the_references(golden, tmp_path, form, cache):
    path = RGB_ZIP if form == "zip" else _extracted(RGB_ZIP, tmp_path / "set")
    source = _open(path, use_labels=True, xflip=True, cache=cache)
    rows = np.arange(len(source))
    assert len(source) == len(golden["rgb_images"]) == 20  # 10 images, doubled by xflip
    image = source.fields["image"]
    assert image.cached is cache and source.prefetch == (0 if cache else 2)
    # What ImageFolderDataset.__getitem__ returns (uint8 CHW), in dew's HWC ...
    np.testing.assert_array_equal(image.uint8(rows), _hwc(golden["rgb_images"]))
    # ... and what training_loop.py feeds the network (float32 u8 / 127.5 - 1): the same float32
    # operations, so the same bits.
    batch = image[rows]
    assert batch.dtype == np.float32 and batch.shape == (20, 8, 8, 3)
    np.testing.assert_array_equal(batch, _hwc(golden["rgb_float"]))
    # The reference's labels are one-hot rows of width max(class) + 1; dew keeps the index.
    assert source.num_classes == golden["rgb_labels"].shape[1] == 3
    np.testing.assert_array_equal(np.eye(3, dtype=np.float32)[source.fields["label"]], golden["rgb_labels"])
    assert source.fields["label"].dtype == np.int32


def test_max_size_keeps_the_references_subset(golden):
    raw, mirrored = reference_rows(10, max_size=6, seed=3, xflip=True)
    np.testing.assert_array_equal(raw, golden["subset_raw_idx"])
    np.testing.assert_array_equal(mirrored, golden["subset_xflip"].astype(bool))
    source = _open(RGB_ZIP, use_labels=True, xflip=True, max_size=6, max_size_seed=3)
    rows = np.arange(len(source))
    np.testing.assert_array_equal(source.fields["image"].uint8(rows), _hwc(golden["subset_images"]))
    np.testing.assert_array_equal(
        np.eye(3, dtype=np.float32)[source.fields["label"]], golden["subset_labels"]
    )
    # The rows without xflip are the first half; validation is every stored image, unmirrored.
    validation = dew.datasets["image_folder"]("validation", path=str(RGB_ZIP), xflip=True, max_size=6)
    np.testing.assert_array_equal(
        validation.fields["image"].uint8(np.arange(10)), _hwc(golden["rgb_images"][:10])
    )


def test_greyscale_and_unlabelled_sets(golden):
    gray = _open(GRAY_ZIP)
    np.testing.assert_array_equal(gray.fields["image"].uint8(np.arange(6)), _hwc(golden["gray_images"]))
    assert gray.fields["image"].shape == (6, 8, 8, 1) and "label" not in gray.fields
    # use_labels=False on a labelled set: no label field (the reference's label_dim is 0).
    plain = _open(RGB_ZIP)
    assert (
        "label" not in plain.fields and plain.num_classes is None and int(golden["unlabelled_label_dim"]) == 0
    )
    # The reference finds no labels in the greyscale set, and its train.py --cond=1 refuses it.
    assert not bool(golden["gray_has_labels"])
    with pytest.raises(
        ImageFolderError, match=r"has no labels .* but use_labels=True; expected use_labels=False"
    ):
        _open(GRAY_ZIP, use_labels=True)


def test_a_cached_set_decodes_nothing_after_opening_and_resumes_exactly(monkeypatch):
    source = _open(RGB_ZIP, use_labels=True, xflip=True)

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded an image after the source opened")

    monkeypatch.setattr(PIL.Image, "open", no_decoding)
    straight = Dataset(source, 4, seed=5, share=DataPartition(0, 1))
    batches = [next(straight) for _ in range(7)]  # crosses the epoch boundary (5 batches an epoch)
    interrupted = Dataset(source, 4, seed=5)
    for _ in range(3):
        next(interrupted)
    continued = Dataset(source, 4, seed=5)
    continued.read_position(interrupted.save_position())
    for want in batches[3:]:
        got = next(continued)
        np.testing.assert_array_equal(got["image"], want["image"])
        np.testing.assert_array_equal(got["label"], want["label"])
    # Every row of an epoch comes once: the 10 images, each once plain and once mirrored.
    epoch = np.concatenate([b["image"] for b in batches[:5]])
    assert len({row.tobytes() for row in epoch}) == 20


def _write_png(path: pathlib.Path, shape: tuple[int, ...], seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    PIL.Image.fromarray(pixels).save(path)


def test_mixed_resolutions_name_the_odd_image(tmp_path):
    _write_png(tmp_path / "set" / "a.png", (8, 8, 3))
    _write_png(tmp_path / "set" / "b" / "c.png", (16, 16, 3))
    for cache in (True, False):  # decoded when caching, from the headers otherwise
        with pytest.raises(ImageFolderError, match=r"'b/c.png' is 16x16x3 \(HxWxC\) but 'a.png' is 8x8x3"):
            _open(tmp_path / "set", cache=cache)
    _write_png(tmp_path / "wide" / "a.png", (8, 16, 3))
    with pytest.raises(ImageFolderError, match="images are 8x16; expected square images"):
        _open(tmp_path / "wide")
    with pytest.raises(ImageFolderError, match=r"images are 8x8, config\.dataset\.resolution=32"):
        _open(RGB_ZIP, resolution=32)


def test_an_image_past_pils_decompression_bomb_limit_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 100)  # 16x16 is past twice the limit
    _write_png(tmp_path / "set" / "a.png", (8, 8, 3))
    _write_png(tmp_path / "set" / "b" / "bomb.png", (16, 16, 3))
    for cache in (True, False):  # decoded when caching, from the headers otherwise
        with pytest.raises(ImageFolderError) as failure:
            _open(tmp_path / "set", cache=cache)
        assert str(failure.value) == (
            f"image_folder: {tmp_path / 'set' / 'b' / 'bomb.png'} is 256 pixels, past PIL's limit of 200 "
            "(PIL.Image.MAX_IMAGE_PIXELS guards against decompression bombs); remove it or resize it"
        )


def test_paths_that_are_not_data_sets(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no images here")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "broken.zip").write_bytes(b"not a zip")
    cases = {
        tmp_path / "notes": "holds no image files",
        tmp_path / "missing": "does not exist",
        tmp_path / "file.txt": "is neither a directory nor a .zip",
        tmp_path / "broken.zip": "is not a readable zip",
    }
    for path, what in cases.items():
        with pytest.raises(ImageFolderError) as failure:
            _open(path)
        message = str(failure.value)
        assert what in message and repr(str(path)) in message and "\n" not in message
        assert "dataset_tool.py" in message  # what would be accepted
    # A dataset.json that misses an image names it.
    folder = _extracted(RGB_ZIP, tmp_path / "partial")
    (folder / "00000" / "img00000010.png").write_bytes((folder / "00000" / "img00000000.png").read_bytes())
    with pytest.raises(ImageFolderError, match=r"no label for '00000/img00000010.png' \(1 of 11"):
        _open(folder, use_labels=True)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--config.dataset.path={empty}"], r"holds no image files; expected a directory or \.zip"),
        (["--config.dataset.path={gray}", "--config.dataset.use_labels=True"], "has no labels"),
        (["--config.dataset.path={mixed}"], r"'b.png' is 16x16x1 \(HxWxC\) but 'a.png' is 8x8x1"),
        (["--config.dataset.path={gray}", "--config.dataset.max_size=0"], "max_size=0 is invalid"),
        (  # once exit 1 and a traceback file, the image unnamed (PIL's limit lowered to 100 here)
            ["--config.dataset.path={bomb}"],
            r"/bomb/bomb.png is 256 pixels, past PIL's limit of 200 \(PIL.Image.MAX_IMAGE_PIXELS guards",
        ),
    ],
)
def test_bad_data_sets_stop_the_cli_before_anything_is_written(
    tmp_path, capsys, monkeypatch, options, message
):
    import re

    from dew.main import main

    (tmp_path / "empty").mkdir()
    _write_png(tmp_path / "mixed" / "a.png", (8, 8))
    _write_png(tmp_path / "mixed" / "b.png", (16, 16))
    _write_png(tmp_path / "bomb" / "a.png", (8, 8))
    _write_png(tmp_path / "bomb" / "bomb.png", (16, 16))
    if "bomb" in options[0]:
        monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 100)
    paths = {
        "empty": tmp_path / "empty",
        "gray": GRAY_ZIP,
        "mixed": tmp_path / "mixed",
        "bomb": tmp_path / "bomb",
    }
    workdir = tmp_path / "run"
    args = ["--config", EDM, "--workdir", str(workdir), "--config.dataset.name=image_folder"]
    code = main([*args, *(o.format(**paths) for o in options)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and re.search(message, err), err
    assert not workdir.exists()


def test_the_decoded_table_is_shared_by_the_two_splits():
    train = _open(RGB_ZIP, xflip=True)
    validation = dew.datasets["image_folder"]("validation", path=str(RGB_ZIP))
    assert train.fields["image"]._pixels is validation.fields["image"]._pixels
    assert len(image_folder_module._TABLES) >= 1


def test_the_trainer_builds_a_class_conditional_run_on_the_references_archive(tmp_path):
    from dew.config import apply_overrides, load_config
    from dew.training.trainer import Trainer

    overrides = [
        "config.dataset.name=image_folder",
        f"config.dataset.path={RGB_ZIP}",
        "config.dataset.use_labels=True",
        "config.dataset.xflip=True",
        "config.dataset.batch_size=4",
        "config.eval.num_batches=1",
        "config.mesh.devices=1",
    ]
    trainer = Trainer(apply_overrides(load_config(EDM), overrides), str(tmp_path / "run"))
    assert trainer.train_source.fields["image"].shape == (20, 8, 8, 3)
    assert trainer.val_source.fields["image"].shape == (10, 8, 8, 3)  # stored images, unmirrored
    assert trainer.objective.input_spec.sample.shape == (8, 8, 3)
    assert trainer.objective.input_spec.conditions["label"].encoder == "class_label"
    assert trainer.train_source.num_classes == 3
    assert not (tmp_path / "run").exists()  # building writes nothing
