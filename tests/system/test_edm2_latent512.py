"""``experiments/edm2.py:img512-*`` train in Stable Diffusion's VAE latent space as NVlabs/edm2's
``StabilityVAEEncoder`` (its defaults: ``third_party/edm2/encoder_defaults.json``, read from the
reference's own class by ``make_latent_reference.py``); a tiny img512-shaped run (size
overrides, a random-weight VAE written by ``experiments/latent_digits_data.py``) trains a step and
decodes its preview through the VAE; a missing VAE file is one line. Nothing is downloaded."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from helpers_common import ROOT

from dew.config import apply_overrides, load_config
from dew.encoding import stability_vae
from dew.networks import sd_vae
from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.trainer import Trainer
from dew.training.trainer_config import resolve_config

with open(ROOT / "third_party" / "edm2" / "encoder_defaults.json") as f:
    REFERENCE = json.load(f)["StabilityVAEEncoder"]
PRESETS = ("img512-xxs", "img512-xs", "img512-s", "img512-m", "img512-l", "img512-xl", "img512-xxl")

spec = importlib.util.spec_from_file_location(
    "latent_digits_data", ROOT / "experiments" / "latent_digits_data.py"
)
assert spec is not None and spec.loader is not None
data_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(data_script)


def preset(name: str):
    return resolve_config(load_config(str(ROOT / "experiments" / f"edm2.py:{name}")))


@pytest.mark.parametrize("name", PRESETS)
def test_img512_presets_resolve_to_the_reference_stability_vae_encoder(name):
    c = preset(name)
    assert c.dataset.name == "latent_dataset" and c.dataset.use_labels
    latent = c.objective.latent
    assert latent.encoder == "stability_vae"
    assert REFERENCE["vae_name"] == "stabilityai/sd-vae-ft-mse"
    assert latent.weights == "" and not latent.allow_unpinned  # the default path, digest-checked
    # sd-vae-ft-mse's AutoencoderKL shape, the one the reference's vae_name loads
    assert tuple(latent.vae_channels) == sd_vae.SD_VAE.block_out_channels
    assert latent.vae_layers_per_block == sd_vae.SD_VAE.layers_per_block
    assert latent.vae_groups == sd_vae.SD_VAE.norm_num_groups
    assert latent.vae_latent_channels == sd_vae.SD_VAE.latent_channels
    # the latent scaling the codec applies: the reference encoder's defaults, exactly
    scaling = stability_vae.EDM2_SCALING
    assert list(scaling.raw_mean) == REFERENCE["raw_mean"]
    assert list(scaling.raw_std) == REFERENCE["raw_std"]
    assert scaling.final_mean == REFERENCE["final_mean"] and scaling.final_std == REFERENCE["final_std"]
    want_scale = np.float32(REFERENCE["final_std"]) / np.float32(REFERENCE["raw_std"])
    np.testing.assert_array_equal(scaling.scale, want_scale)
    np.testing.assert_array_equal(
        scaling.bias, np.float32(REFERENCE["final_mean"]) - np.float32(REFERENCE["raw_mean"]) * want_scale
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """12 digits as 32x32 RGB encoded into 8x8x(4+4) raw latents by a random-weight VAE."""
    root = tmp_path_factory.mktemp("latent512")
    assert data_script.main([f"--dest={root}", "--max_images=12", "--random_vae"]) == 0
    return root


def tiny_img512(data, **overrides):
    """img512-xs with sizes shrunk: the random VAE's shape, a 2-level 8-channel network, 2 steps."""
    vae = data_script.VAE
    sections = {
        "dataset": {"path": str(data / "latents"), "batch_size": 4},
        "objective.latent": {
            "weights": str(data / "random_vae.safetensors"),
            "allow_unpinned": True,  # the random VAE has no published digest
            "vae_channels": tuple(vae.block_out_channels),
            "vae_layers_per_block": vae.layers_per_block,
            "vae_groups": vae.norm_num_groups,
        },
        "model": {
            "model_channels": 8,
            "channel_mult": (1, 2),
            "num_blocks": 1,
            "attn_resolutions": (4,),
            "channels_per_head": 8,
            "logvar_channels": 8,
            "use_fp16": False,
        },
        "train": {"num_steps": 1, "log_every": 1},
        "checkpoint": {"every": 1},
        "preview": {"every": 1},
        "ema": {"snapshot_every": 1},
        "objective.sampling": {"steps": 2, "per_class": 1},
        "mesh": {"devices": 1},
    }
    settings = {f"{section}.{k}": v for section, keys in sections.items() for k, v in keys.items()}
    settings.update(overrides)
    lines = [f"config.{k}={v if isinstance(v, str) else repr(v)}" for k, v in settings.items()]
    return apply_overrides(load_config(str(ROOT / "experiments" / "edm2.py:img512-xs")), lines)


@pytest.mark.slow  # compiles an EDM2 step, a 2-step sampler and the VAE decoder
def test_a_tiny_img512_run_trains_a_step_and_decodes_its_preview(data, tmp_path):
    from test_pipeline import Capture

    import dew

    capture = Capture()
    state = Trainer(tiny_img512(data), str(tmp_path / "run"), [capture]).run()
    assert int(state.step) == 1
    preview = capture.artifacts[("samples", 1)]
    assert preview.images.shape == (10, 32, 32, 3)  # one per class, decoded to the VAE's pixels
    u = (preview.images + 1.0) * 127.5  # edm2's uint8 decode, shown as u / 127.5 - 1
    np.testing.assert_allclose(u, np.round(u), rtol=0, atol=255 * 2**-23)
    assert np.ptp(u) > 0  # not a constant image
    np.testing.assert_array_equal(dew.pipeline(str(tmp_path / "run"))().images, preview.images)


def test_a_missing_vae_file_is_one_line_naming_it_and_how_to_get_it(data, tmp_path, monkeypatch):
    from dew.networks import sd_vae_weights

    missing = tmp_path / "nowhere" / sd_vae_weights.SOURCE_NAME
    monkeypatch.setenv(sd_vae_weights.ENV_VAR, str(missing))
    config = tiny_img512(data, **{"objective.latent.weights": ""})  # the preset's default path
    with pytest.raises(ConfigError) as info:
        build_objective(config, open_split(config.dataset, "train"))
    message = str(info.value)
    assert "\n" not in message
    assert str(missing) in message and "stabilityai/sd-vae-ft-mse" in message
    pins = sorted(sd_vae_weights.PINNED_SHA256)
    assert all(p in message for p in pins) if pins else "no SHA-256 is pinned" in message


def test_an_uncached_latent_set_reads_the_same_rows_lazily(data):
    """The img512 presets read latents per batch (ImageNet-512's 1.28 M × 128 KiB is not held in
    memory): the same values as the cached set, for an index array, an int and a slice."""
    from dew.data.sources.latent_dataset import LatentRows
    from dew.data.sources.latent_source import latent_dataset

    assert preset("img512-xs").dataset.cache is False
    lazy = latent_dataset(path=str(data / "latents"), use_labels=True, cache=False)
    eager = latent_dataset(path=str(data / "latents"), use_labels=True)
    rows, table = lazy.fields["image"], eager.fields["image"]
    assert isinstance(rows, LatentRows) and isinstance(table, np.ndarray)
    assert rows.shape == table.shape == (12, 8, 8, 8) and rows.dtype == table.dtype == np.float32
    index = np.array([11, 0, 5, 5])
    np.testing.assert_array_equal(rows[index], table[index])
    np.testing.assert_array_equal(rows[3], table[3])
    np.testing.assert_array_equal(rows[-1], table[-1])
    np.testing.assert_array_equal(rows[2:7:2], table[2:7:2])
    np.testing.assert_array_equal(lazy.fields["label"], eager.fields["label"])
    assert lazy.prefetch > 0 and eager.prefetch == 0
