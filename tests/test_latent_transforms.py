"""``dew.data.sources.latent_transforms`` is NVlabs/edm2 ``dataset_tool.py convert``'s crop and
resize: bit-identical to the reference's own ``make_transform`` outputs
(``third_party/edm2/transform_reference.npz``, made by ``make_latent_reference.py``) for every
mode, resolution and generated image, including the images the reference skips; and the encode
command with ``--transform`` encodes the transformed images."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from helpers_common import ROOT

from dew.data.sources import latent_transforms as lt

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

REFERENCE = np.load(ROOT / "third_party" / "edm2" / "transform_reference.npz")
INPUTS = {int(k.split("/")[1]): REFERENCE[k] for k in REFERENCE.files if k.startswith("input/")}
CASES = sorted({tuple(k.split("/")[:2]) for k in REFERENCE.files if not k.startswith("input/")})


@pytest.mark.parametrize(("mode", "resolution"), CASES)
def test_transform_matches_the_reference_exactly(mode, resolution):
    width, height = lt.parse_resolution(resolution)
    fn = lt.make_transform(None if mode == "scale" else mode, width, height)
    for i, image in sorted(INPUTS.items()):
        got = fn(image.copy())
        key = f"{mode}/{resolution}/{i}"
        if key not in REFERENCE.files:
            assert got is None, f"{key}: the reference skips this image, dew returned {np.shape(got)}"
            continue
        want = REFERENCE[key]
        assert got is not None and got.dtype == np.uint8, key
        np.testing.assert_array_equal(got, want, err_msg=key)  # integer pixels: exact


def test_the_reference_covers_every_branch():
    assert {m for m, _ in CASES} == {"scale", *lt.TRANSFORMS}
    skipped = [
        f"center-crop-wide/{r}/{i}"
        for _, r in CASES
        for i in INPUTS
        if f"center-crop-wide/{r}/{i}" not in REFERENCE.files
    ]
    assert skipped, "no image exercises center-crop-wide's skip"
    # ADM's BOX halving runs 0, 1 and 2 times for some (size, resolution)
    halvings = {
        (int(np.floor(np.log2(min(img.shape[:2]) / s))) if min(img.shape[:2]) >= 2 * s else 0)
        for img in INPUTS.values()
        for s in (16, 32)
    }
    assert {0, 1, 2} <= halvings


def test_bad_transform_arguments_are_one_line():
    with pytest.raises(ValueError, match=r"--resolution='512' is invalid: expected WxH"):
        lt.parse_resolution("512")
    with pytest.raises(ValueError, match=r"--transform='crop' is invalid: expected one of"):
        lt.make_transform("crop", 8, 8)
    with pytest.raises(ValueError, match=r"--transform=center-crop needs --resolution=WxH"):
        lt.make_transform("center-crop", None, None)
    with pytest.raises(
        ValueError, match=r"center-crop-dhariwal with --resolution=16x8: expected W equal to H"
    ):
        lt.make_transform("center-crop-dhariwal", 16, 8)


def test_load_rgb_converts_as_the_reference_reads():
    from PIL import Image

    grey = (np.arange(12 * 10, dtype=np.uint8).reshape(12, 10) * 2).astype(np.uint8)
    f = io.BytesIO()
    Image.fromarray(grey, "L").save(f, format="png")
    f.seek(0)
    rgb = lt.load_rgb(f)
    assert rgb.shape == (12, 10, 3) and rgb.dtype == np.uint8
    np.testing.assert_array_equal(rgb, np.repeat(grey[:, :, None], 3, axis=2))


def test_encode_with_a_transform_encodes_the_transformed_images(tmp_path):
    """Mixed-size source images, --transform=center-crop-dhariwal --resolution=16x16: the stored
    latents are the codec's encode_pixels of the reference transform's output."""
    import jax
    import jax.numpy as jnp
    from PIL import Image

    from dew.data.sources.latent_dataset import _sharded_encoder, encode_dataset, read_latent_dataset
    from dew.encoding.stability_vae import StabilityVAECodec
    from dew.networks import sd_vae

    spec = __import__("importlib.util").util.spec_from_file_location(
        "latent_digits_data", ROOT / "experiments" / "latent_digits_data.py"
    )
    data_script = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(data_script)
    config = sd_vae.VAEConfig(
        block_out_channels=(8, 8), layers_per_block=1, latent_channels=4, norm_num_groups=4
    )
    codec = StabilityVAECodec(data_script.random_vae_params(config, seed=1), config)
    source = tmp_path / "images"
    source.mkdir()
    picks = [0, 2, 4]  # 37x53, 100x75, 150x97: three sizes
    for n, i in enumerate(picks):
        Image.fromarray(INPUTS[i]).save(source / f"img{n:05d}.png")
    (source / "dataset.json").write_text(json.dumps({"labels": [[f"img{n:05d}.png", n] for n in range(3)]}))
    report = encode_dataset(
        str(source),
        str(tmp_path / "latents"),
        codec,
        batch_size=3,
        transform="center-crop-dhariwal",
        resolution=(16, 16),
    )
    assert (report.total, report.encoded) == (3, 3)
    raw, labels = read_latent_dataset(str(tmp_path / "latents"))
    want_pixels = np.stack([REFERENCE[f"center-crop-dhariwal/16x16/{i}"] for i in picks])
    # the command's own jitted encoder on the reference-transformed batch, padded as the command
    # pads it to a multiple of the device count: the same call, so bit for bit
    per_call = -(-3 // len(jax.devices())) * len(jax.devices())
    padded = np.concatenate([want_pixels, np.repeat(want_pixels[-1:], per_call - 3, axis=0)])
    want = np.asarray(_sharded_encoder(codec)(jnp.asarray(padded)))[:3]
    assert labels is not None
    assert raw.shape == (3, 8, 8, 8) and list(labels) == [0, 1, 2]
    np.testing.assert_array_equal(raw, want)
    assert json.loads((tmp_path / "latents" / "encode.json").read_text())["transform"] == [
        "center-crop-dhariwal",
        16,
        16,
    ]


def test_center_crop_wide_skips_what_the_reference_skips(tmp_path):
    """Images too narrow for --resolution are left out (convert skips them); the rest are indexed
    contiguously, as encoding convert's output indexes them."""
    from PIL import Image

    from dew.data.sources.latent_dataset import kept_images

    source = tmp_path / "images"
    source.mkdir()
    for i, image in sorted(INPUTS.items()):
        Image.fromarray(image).save(source / f"img{i:05d}.png")
    from dew.data.sources.image_folder import ImageFiles

    files = ImageFiles(str(source))
    kept = kept_images(files, files.images, ("center-crop-wide", 32, 32))
    want = [f"img{i:05d}.png" for i in sorted(INPUTS) if f"center-crop-wide/32x32/{i}" in REFERENCE.files]
    assert kept == want and len(kept) < len(INPUTS)
