"""The latent data set encoder (edm2 ``dataset_tool.py encode``'s format) on images the test makes:
values equal to the codec's, edm2's layout and labels, resume, sharding, and one-line refusals."""

from __future__ import annotations

import io
import json
import os

import jax
import numpy as np
import PIL.Image
import pytest

from dew.data.sources import latent_dataset
from dew.encoding.stability_vae import StabilityVAECodec
from dew.networks import sd_vae

TINY = sd_vae.VAEConfig(block_out_channels=(32, 64), layers_per_block=1, latent_channels=4, norm_num_groups=8)
U32 = float(np.finfo(np.float32).eps) / 2


@pytest.fixture(scope="module")
def codec():
    return tiny_codec()


def tiny_codec() -> StabilityVAECodec:
    """A random-weight SD-VAE of ``TINY``'s shape (downsampling 2, 4 latent channels)."""
    rng = np.random.default_rng(3)
    params = {
        module: {
            k: (1.0 if k == "scale" else 0.0)
            + rng.standard_normal(s).astype(np.float32) / np.sqrt(np.prod(s[:-1]) or 1)
            for k, s in leaves.items()
        }
        for module, leaves in sd_vae.expected_shapes(TINY).items()
    }
    return StabilityVAECodec(params, TINY)


def _make_images(path, count=5, labels=True):
    rng = np.random.default_rng(7)
    os.makedirs(path)
    images, entries = [], []
    for i in range(count):
        image = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        name = f"img{i:03d}.png"
        PIL.Image.fromarray(image).save(os.path.join(path, name))
        images.append(image)
        entries.append([name, i % 3])
    if labels:
        with open(os.path.join(path, "dataset.json"), "w") as f:
            json.dump({"labels": entries}, f)
    return np.stack(images)


def test_encodes_to_edm2s_layout_with_the_codecs_values(tmp_path, codec):
    """Every image's file holds encode_pixels' mean ‖ std as float32 [8, 8, 8] (CHW, as edm2's
    np.save of the NCHW tensor row), at edm2's name; labels follow dataset.json. The batches here
    are sharded over the 8 test devices (batch 2 rounds up to 8; the 5 images are one padded call),
    while the expected values come from one unsharded call on all 5: the same float32 function of
    each image, so equal to XLA's roundoff, bounded by 2·γ_n·max|v| with n ≤ 20,000 accumulated
    terms on this path (see tests/test_sd_vae.py's path length)."""
    images = _make_images(tmp_path / "src")
    dest = tmp_path / "latents"
    lines = []
    report = latent_dataset.encode_dataset(
        str(tmp_path / "src"), str(dest), codec, batch_size=2, progress=lines.append
    )
    assert (report.total, report.encoded, report.skipped) == (5, 5, 0)
    assert lines[-1] == "encode: 5/5 images"
    want = np.asarray(jax.jit(codec.encode_pixels)(images))
    n = 20_000
    bound = 2 * n * U32 / (1 - n * U32) * np.abs(want).max()
    for i in range(5):
        got = np.load(dest / latent_dataset.latent_name(i), allow_pickle=False)
        assert got.dtype == np.float32 and got.shape == (8, 8, 8)
        assert np.abs(got.transpose(1, 2, 0) - want[i]).max() <= bound
    assert latent_dataset.latent_name(1234) == "00001/img-mean-std-00001234.npy"
    with open(dest / "dataset.json") as f:
        labels = json.load(f)["labels"]
    assert labels == [[latent_dataset.latent_name(i), i % 3] for i in range(5)]
    raw, read_labels = latent_dataset.read_latent_dataset(str(dest))
    assert read_labels is not None
    assert raw.shape == (5, 8, 8, 8) and list(read_labels) == [i % 3 for i in range(5)]
    assert np.all(raw[..., 4:] > 0)  # the std half


def test_resume_encodes_only_what_is_missing(tmp_path, codec):
    """An interrupted run (files of images 1 and 3 and dataset.json missing, a stray temporary
    file left) resumes: only those two are encoded, the others keep their bytes, and the result
    equals an uninterrupted run's."""
    _make_images(tmp_path / "src", labels=False)
    dest = tmp_path / "latents"
    latent_dataset.encode_dataset(
        str(tmp_path / "src"), str(dest), codec, batch_size=2, progress=lambda _: None
    )
    before = {i: (dest / latent_dataset.latent_name(i)).read_bytes() for i in range(5)}
    for i in (1, 3):
        os.remove(dest / latent_dataset.latent_name(i))
    os.remove(dest / "dataset.json")
    (dest / (latent_dataset.latent_name(3) + ".tmp-1")).write_bytes(b"partial")
    mtime0 = os.stat(dest / latent_dataset.latent_name(0)).st_mtime_ns
    report = latent_dataset.encode_dataset(
        str(tmp_path / "src"), str(dest), codec, batch_size=2, progress=lambda _: None
    )
    assert (report.encoded, report.skipped) == (2, 3)
    assert os.stat(dest / latent_dataset.latent_name(0)).st_mtime_ns == mtime0
    for i in range(5):
        got = np.load(dest / latent_dataset.latent_name(i))
        np.testing.assert_allclose(got, np.load(io.BytesIO(before[i])), rtol=0, atol=1e-5)
    with open(dest / "dataset.json") as f:
        assert json.load(f) == {"labels": None}
    assert not (dest / (latent_dataset.latent_name(3) + ".tmp-1")).exists()  # a dead run's leftover


def test_refuses_a_dest_made_from_something_else(tmp_path, codec):
    _make_images(tmp_path / "src")
    dest = tmp_path / "latents"
    latent_dataset.encode_dataset(
        str(tmp_path / "src"), str(dest), codec, batch_size=8, max_images=3, progress=lambda _: None
    )
    with pytest.raises(latent_dataset.LatentDatasetError, match="num_images") as e:
        latent_dataset.encode_dataset(str(tmp_path / "src"), str(dest), codec, progress=lambda _: None)
    assert "\n" not in str(e.value)
    other = tmp_path / "occupied"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(latent_dataset.LatentDatasetError, match="not empty"):
        latent_dataset.encode_dataset(str(tmp_path / "src"), str(other), codec, progress=lambda _: None)


def test_a_signed_convention_encodes_minus_one_to_one_and_records_it(tmp_path, codec):
    """``--pixels=dit`` / ``repa``: the encoder sees u / 127.5 − 1 (DiT's, SiT's and REPA's
    training images), ``encode.json`` names the convention, and a rerun with edm2's [0, 1] into
    the same ``--dest`` is refused (its latents would be of other images)."""
    images = _make_images(tmp_path / "src", count=2)
    signed = StabilityVAECodec(codec.params, TINY, pixels="repa")
    dest = tmp_path / "latents"
    latent_dataset.encode_dataset(str(tmp_path / "src"), str(dest), signed, progress=lambda _: None)
    stored = np.load(dest / latent_dataset.latent_name(0)).transpose(1, 2, 0)
    want = np.asarray(jax.jit(signed.encode_pixels)(images[:1]))[0]
    np.testing.assert_array_equal(stored, want)
    unit = np.asarray(jax.jit(codec.encode_pixels)(images[:1]))[0]
    assert np.abs(stored - unit).max() > 1e-2  # another input range, other latents
    with open(dest / latent_dataset.MANIFEST) as f:
        assert json.load(f)["pixels"] == "repa"
    with pytest.raises(latent_dataset.LatentDatasetError, match="pixels"):
        latent_dataset.encode_dataset(str(tmp_path / "src"), str(dest), codec, progress=lambda _: None)


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    _make_images(tmp_path / "src")
    dest = tmp_path / "latents"
    assert latent_dataset.main([f"--source={tmp_path / 'src'}", f"--dest={dest}", "--batch_size=0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--batch_size=0" in err
    missing = tmp_path / "absent.safetensors"
    assert (
        latent_dataset.main([f"--source={tmp_path / 'src'}", f"--dest={dest}", f"--weights={missing}"]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err and "stabilityai/sd-vae-ft-mse" in err
    assert latent_dataset.main([f"--source={tmp_path / 'nowhere'}", f"--dest={dest}"]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert not dest.exists()


# --- the images beside the latents (REPA: the encoder sees the image, the network the latent) -----


def _make_wide_images(path, count=5):
    """``count`` random 24x20 RGB images (not square: ADM's center crop has work to do), labelled."""
    rng = np.random.default_rng(11)
    os.makedirs(path)
    entries = []
    for i in range(count):
        name = f"img{i:03d}.png"
        PIL.Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(os.path.join(path, name))
        entries.append([name, (2 * i) % 3])
    with open(os.path.join(path, "dataset.json"), "w") as f:
        json.dump({"labels": entries}, f)


def encode_with_images(tmp_path, codec):
    """A tiny image folder ADM-center-cropped to 16² and encoded with its images beside:
    (the latents' directory, the images' directory)."""
    _make_wide_images(tmp_path / "src")
    dest, pictures = tmp_path / "vae-sd", tmp_path / "images"
    report = latent_dataset.encode_dataset(
        str(tmp_path / "src"),
        str(dest),
        codec,
        batch_size=2,
        transform="center-crop-dhariwal",
        resolution=(16, 16),
        images_dest=str(pictures),
        progress=lambda _: None,
    )
    assert (report.total, report.encoded) == (5, 5)
    return dest, pictures


def test_images_dest_holds_the_encoded_images_beside_the_latents(tmp_path, codec):
    """--images_dest writes each image as it was encoded, ADM-center-cropped, at convert's names
    with its labels; ``latent_dataset(images=...)`` reads them back as ``pixels`` row for row
    beside the latents (cached and lazily, the same values), and each latent row is the codec's
    encoding of its ``pixels`` row (bound of the first test)."""
    from dew.data.sources import latent_transforms
    from dew.data.sources.latent_source import PixelRows
    from dew.data.sources.latent_source import latent_dataset as source_of

    dest, pictures = encode_with_images(tmp_path, codec)
    crop = latent_transforms.make_transform("center-crop-dhariwal", 16, 16)
    for i in range(5):
        with open(tmp_path / "src" / f"img{i:03d}.png", "rb") as f:
            want = crop(latent_transforms.load_rgb(f))
        got = np.array(PIL.Image.open(pictures / latent_dataset.image_name(i)))
        np.testing.assert_array_equal(got, want)
    assert latent_dataset.image_name(1234) == "00001/img00001234.png"
    with open(pictures / "dataset.json") as f:
        assert json.load(f)["labels"] == [[latent_dataset.image_name(i), (2 * i) % 3] for i in range(5)]

    source = source_of(path=str(dest), use_labels=True, images=str(pictures))
    pixels = source.fields["pixels"]
    assert pixels.dtype == np.uint8 and pixels.shape == (5, 16, 16, 3)
    assert list(source.fields["label"]) == [(2 * i) % 3 for i in range(5)]
    lazy = source_of(path=str(dest), use_labels=True, cache=False, images=str(pictures)).fields["pixels"]
    assert isinstance(lazy, PixelRows) and lazy.shape == pixels.shape
    np.testing.assert_array_equal(lazy[np.arange(5)], pixels)
    np.testing.assert_array_equal(lazy[3], pixels[3])
    want = np.asarray(jax.jit(codec.encode_pixels)(np.asarray(pixels)))
    n = 20_000
    bound = 2 * n * U32 / (1 - n * U32) * np.abs(want).max()
    assert np.abs(np.asarray(source.fields["image"]) - want).max() <= bound


def test_images_dest_resumes_only_what_is_missing(tmp_path, codec):
    """A run interrupted after some latents and fewer images resumes both: the missing image
    files are written, the missing latents encoded, nothing else touched."""
    dest, pictures = encode_with_images(tmp_path, codec)
    before = {i: (pictures / latent_dataset.image_name(i)).read_bytes() for i in range(5)}
    os.remove(pictures / latent_dataset.image_name(2))
    os.remove(pictures / latent_dataset.image_name(4))
    os.remove(dest / latent_dataset.latent_name(4))
    mtime = os.stat(pictures / latent_dataset.image_name(0)).st_mtime_ns
    report = latent_dataset.encode_dataset(
        str(tmp_path / "src"),
        str(dest),
        codec,
        batch_size=2,
        transform="center-crop-dhariwal",
        resolution=(16, 16),
        images_dest=str(pictures),
        progress=lambda _: None,
    )
    assert (report.encoded, report.skipped) == (1, 4)
    assert os.stat(pictures / latent_dataset.image_name(0)).st_mtime_ns == mtime
    assert {i: (pictures / latent_dataset.image_name(i)).read_bytes() for i in range(5)} == before


def test_a_resumed_stream_carries_the_same_images_beside_the_same_latents(tmp_path, codec):
    """The Dataset's position covers the pixels field: a stream resumed from a saved position
    draws the same (latent, pixels, label) rows as one never interrupted, and every drawn pixels
    row is the one stored beside its latent."""
    from dew.data import Dataset
    from dew.data.sources.latent_source import latent_dataset as source_of

    dest, pictures = encode_with_images(tmp_path, codec)

    def stream():
        return Dataset(
            source_of(path=str(dest), use_labels=True, cache=False, images=str(pictures)), 2, seed=4
        )

    def take(dataset, k):
        return [next(dataset) for _ in range(k)]

    whole = stream()
    straight = take(whole, 7)  # 2 per batch over 5 rows: crosses epoch boundaries
    first = stream()
    head = take(first, 3)
    resumed = stream()
    resumed.read_position(first.save_position())
    got = head + take(resumed, 4)
    for dataset in (whole, first, resumed):
        dataset.close()  # their feed threads end here, not in another test
    source = source_of(path=str(dest), use_labels=True, images=str(pictures))
    table = {bytes(np.asarray(source.fields["image"][i]).tobytes()): i for i in range(5)}
    for a, b in zip(got, straight, strict=True):
        for key in ("image", "pixels", "label"):
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))
        for latent, pixels in zip(np.asarray(a["image"]), np.asarray(a["pixels"]), strict=True):
            np.testing.assert_array_equal(pixels, source.fields["pixels"][table[latent.tobytes()]])


def test_images_that_do_not_pair_with_the_latents_are_one_line(tmp_path, codec):
    from dew.data.sources.latent_source import latent_dataset as source_of
    from dew.schema import ConfigError

    dest, pictures = encode_with_images(tmp_path, codec)

    def refused(images, match):
        with pytest.raises(ConfigError, match=match) as info:
            source_of(path=str(dest), use_labels=True, images=str(images))
        assert "\n" not in str(info.value)

    refused(tmp_path / "absent", r"config.dataset.images='.*absent' .*does not exist")
    fewer = tmp_path / "fewer"
    os.makedirs(fewer / "00000")
    for i in range(4):
        (fewer / latent_dataset.image_name(i)).write_bytes(
            (pictures / latent_dataset.image_name(i)).read_bytes()
        )
    refused(fewer, "holds 4 images but config.dataset.path holds 5 latents")
    small = tmp_path / "small"
    os.makedirs(small / "00000")
    for i in range(5):
        PIL.Image.fromarray(np.zeros((12, 16, 3), np.uint8)).save(small / latent_dataset.image_name(i))
    refused(small, "images are 12x16 but the latents 8x8")
    relabelled = tmp_path / "relabelled"
    os.makedirs(relabelled / "00000")
    for i in range(5):
        name = latent_dataset.image_name(i)
        (relabelled / name).write_bytes((pictures / name).read_bytes())
    entries = [[latent_dataset.image_name(i), 1 if i == 3 else (2 * i) % 3] for i in range(5)]
    (relabelled / "dataset.json").write_text(json.dumps({"labels": entries}))
    refused(relabelled, r"'00000/img00000003.png' is labelled 1 but latent row 3 0")


# --- --dest and --images_dest as untrusted places: refused before anything is written --------------


def encode(tmp_path, codec, source="src", dest="vae-sd", images="images"):
    return latent_dataset.encode_dataset(
        str(tmp_path / source),
        str(tmp_path / dest),
        codec,
        batch_size=2,
        transform="center-crop-dhariwal",
        resolution=(16, 16),
        images_dest=str(tmp_path / images),
        progress=lambda _: None,
    )


def test_an_images_dest_that_cannot_be_written_is_one_line_before_dest_is_written(
    tmp_path, codec, capsys, monkeypatch
):
    """Once: NotADirectoryError / PermissionError tracebacks, with encode.json already in --dest."""
    _make_wide_images(tmp_path / "src")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(latent_dataset.LatentDatasetError) as refused:
        encode(tmp_path, codec, images="notes.txt")
    assert str(refused.value) == (
        f"--images_dest={str(tmp_path / 'notes.txt')!r} is a file; expected a directory (new, or this "
        "command's own)"
    )
    with pytest.raises(latent_dataset.LatentDatasetError, match=r"lies under '.*notes.txt', which is a file"):
        encode(tmp_path, codec, images="notes.txt/images")
    (tmp_path / "locked").mkdir()
    access = os.access  # the tests run as root, which writes anywhere: the check is what is tested
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and not str(p).endswith("locked"))
    with pytest.raises(latent_dataset.LatentDatasetError, match=r"'.*locked' is not writable"):
        encode(tmp_path, codec, images="locked/images")
    assert not (tmp_path / "vae-sd").exists() and (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["locked", "notes.txt", "src"]


def test_an_images_dest_of_another_source_is_refused_and_the_latents_never_pair_with_its_images(
    tmp_path, codec
):
    """Once: reused for a second source, --images_dest kept the first source's images beside the
    second's latents, and ``latent_dataset(path=D2, images=I2)`` paired them silently."""
    from dew.data.sources.latent_source import latent_dataset as source_of
    from dew.schema import ConfigError

    _make_wide_images(tmp_path / "src")
    encode(tmp_path, codec)
    (tmp_path / "other").mkdir()
    for i, name in enumerate(sorted(os.listdir(tmp_path / "src"))):  # the same count, other pixels
        if name.endswith(".png"):
            PIL.Image.fromarray(np.full((24, 20, 3), 40 * i, np.uint8)).save(tmp_path / "other" / name)
    (tmp_path / "other" / "dataset.json").write_bytes((tmp_path / "src" / "dataset.json").read_bytes())
    images = tmp_path / "images"
    before = {p: p.read_bytes() for p in images.rglob("*") if p.is_file()}
    with pytest.raises(latent_dataset.LatentDatasetError) as refused:
        encode(tmp_path, codec, source="other", dest="vae-sd-2")
    assert str(refused.value) == (
        f"--images_dest={str(images)!r} holds the images of something else (source differ from its "
        "encode.json); choose another --images_dest or delete it"
    )
    assert not (tmp_path / "vae-sd-2").exists()  # nothing written to --dest first
    assert {p: p.read_bytes() for p in images.rglob("*") if p.is_file()} == before
    encode(tmp_path, codec, source="other", dest="vae-sd-2", images="images-2")
    # Each latent set reads with its own images, and never with the other's.
    source_of(path=str(tmp_path / "vae-sd-2"), images=str(tmp_path / "images-2"))
    with pytest.raises(ConfigError) as unpaired:
        source_of(path=str(tmp_path / "vae-sd-2"), images=str(images))
    assert str(unpaired.value) == (
        f"config.dataset.images={str(images)!r} holds the images of another encoding than "
        f"config.dataset.path={str(tmp_path / 'vae-sd-2')!r} (source differ between their encode.json); "
        "expected the --images_dest written with those latents"
    )


def test_a_killed_runs_partial_images_are_removed_and_a_damaged_record_is_named(tmp_path, codec):
    _make_wide_images(tmp_path / "src")
    encode(tmp_path, codec)
    images = tmp_path / "images"
    partial = images / "00000" / "img00000002.png.tmp-4242"  # a kill mid-write of an image
    partial.write_bytes(b"\x89PNG half")
    os.remove(images / latent_dataset.image_name(2))
    encode(tmp_path, codec)
    assert not partial.exists() and (images / latent_dataset.image_name(2)).is_file()
    assert not [p for p in images.rglob("*") if ".tmp-" in p.name]
    (images / "encode.json").write_text('{"source": ')
    with pytest.raises(latent_dataset.LatentDatasetError) as refused:
        encode(tmp_path, codec)
    assert str(refused.value).startswith(
        f"--images_dest: {images / 'encode.json'} cannot be read (JSONDecodeError"
    )
    assert "\n" not in str(refused.value)
