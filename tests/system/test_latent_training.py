"""Latent diffusion end to end (``config.objective.latent``, EDM2's ImageNet-512 setting) on a
small latent digits set made by ``experiments/latent_digits_data.py`` with a random-weight VAE
written in the published safetensors layout and its latent scaling measured on the digits
(``scaling_file``): the latent draw is edm2's ``encode_latents`` from
the step's key, previews decode through the VAE decoder to uint8 images of the pixel shape, a run
resumes bit for bit, ``dew.pipeline`` redraws its preview, and bad settings are one line."""

from __future__ import annotations

import importlib.util
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers_common import ROOT
from test_training import assert_states_identical

import dew
from dew.artifacts import ImageGrid
from dew.config import apply_overrides, load_config
from dew.networks.sd_vae_weights import load_weights
from dew.objectives import latent_space
from dew.objectives.diffusion import Diffusion
from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.trainer import Trainer

spec = importlib.util.spec_from_file_location(
    "latent_digits_data", ROOT / "experiments" / "latent_digits_data.py"
)
assert spec is not None and spec.loader is not None
data_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(data_script)
VAE = data_script.VAE
IMAGES = 12  # digits encoded: classes 0..9 and two more


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """<dir>/latents (12 digits, 32x32 RGB -> 8x8x4 raw latents ×2), <dir>/random_vae.safetensors
    and <dir>/vae_scaling.json."""
    root = tmp_path_factory.mktemp("latent_digits")
    assert data_script.main([f"--dest={root}", f"--max_images={IMAGES}", "--random_vae"]) == 0
    return root


def latent_config(data, **overrides):
    defaults = {
        "dataset.path": str(data / "latents"),
        "objective.latent.weights": str(data / "random_vae.safetensors"),
        "objective.latent.scaling_file": str(data / "vae_scaling.json"),
        "dataset.batch_size": 4,
        "model.model_channels": 8,
        "model.num_blocks": 1,
        "model.channel_mult": (1,),
        "model.attn_resolutions": (),
        "train.num_steps": 4,
        "train.log_every": 2,
        "checkpoint.every": 2,
        "checkpoint.keep_best": False,
        "eval.every": 0,
        "preview.every": 2,
        "objective.sampling.steps": 3,
        "objective.sampling.per_class": 1,
        "mesh.devices": 1,
    }
    defaults.update(overrides)
    return apply_overrides(
        load_config(str(ROOT / "experiments" / "latent_digits.py")),
        [f"config.{k}={v!r}" if not isinstance(v, str) else f"config.{k}={v}" for k, v in defaults.items()],
    )


def test_safetensors_writer_round_trips_the_vae(data):
    """The random VAE file reads back (real loader, digest check) to the params it was made from."""
    params = load_weights(str(data / "random_vae.safetensors"), allow_unpinned=True, config=VAE)
    made = data_script.random_vae_params(VAE, seed=0)
    assert set(params) == set(made)
    for module, leaves in made.items():
        for leaf, value in leaves.items():
            np.testing.assert_array_equal(np.asarray(params[module][leaf]), value, err_msg=f"{module}/{leaf}")
    with pytest.raises(ValueError, match="not pinned"):
        load_weights(str(data / "random_vae.safetensors"), config=VAE)


def test_training_draws_edm2s_final_latents_from_the_step_key(data):
    config = latent_config(data)
    source = open_split(config.dataset, "train")
    objective = build_objective(config, source)
    assert isinstance(objective, Diffusion)
    raw = jnp.asarray(source.fields["image"][:4])
    assert raw.shape == (4, 8, 8, 8) and objective.input_spec.sample.shape == (8, 8, 4)
    assert objective.image_shape == (32, 32, 3)
    key = jax.random.PRNGKey(5)
    drawn = objective.training_sample({"image": raw}, key)
    # edm2 encode_latents: (mean + ε·std)·scale + bias, ε ~ N(0, 1) from the step key's own stream
    eps = jax.random.normal(jax.random.fold_in(key, latent_space.LATENT_NOISE_STREAM), (4, 8, 8, 4))
    mean, std = np.split(np.asarray(raw, np.float64), 2, axis=-1)
    measured = json.loads((data / "vae_scaling.json").read_text())  # the scaling_file's values
    scale = np.float32(0.5) / np.asarray(measured["raw_std"], np.float32)
    bias = np.float32(0.0) - np.asarray(measured["raw_mean"], np.float32) * scale
    expected = (mean + np.asarray(eps, np.float64) * std) * scale + bias
    # float32: a product, a sum, a product and a sum (4 roundings of |terms| <= the value scale)
    tol = (
        4 * 2**-24 * (np.abs(mean) + np.abs(np.asarray(eps) * std) + 1).max() * scale.max()
        + 4 * 2**-24 * np.abs(bias).max()
    )
    np.testing.assert_allclose(np.asarray(drawn), expected, rtol=0, atol=tol)
    again = objective.training_sample({"image": raw}, key)
    other = objective.training_sample({"image": raw}, jax.random.PRNGKey(6))
    np.testing.assert_array_equal(np.asarray(again), np.asarray(drawn))
    assert not np.allclose(np.asarray(other), np.asarray(drawn))


def test_preview_decodes_sampled_latents_through_the_vae(data):
    config = latent_config(data)
    source = open_split(config.dataset, "train")
    objective = build_objective(config, source)
    assert isinstance(objective, Diffusion)
    batch = {
        "image": jnp.asarray(source.fields["image"][:2]),
        "label": jnp.asarray(source.fields["label"][:2]),
    }
    params = objective.init(jax.random.PRNGKey(0), batch)
    grid = objective.preview(params, jax.random.PRNGKey(1))
    assert isinstance(grid, ImageGrid)
    assert grid.images.shape == (10, 32, 32, 3)  # one per class, the VAE's pixel shape
    # edm2's decode: uint8 pixels u, shown as u / 127.5 - 1
    u = (grid.images + 1.0) * 127.5
    np.testing.assert_allclose(u, np.round(u), atol=255 * 2**-23)
    # the preview's own draw (jitted once per settings), then the codec's decode, jitted here
    draw = objective._jitted[("draw", objective.sampling)]
    latents, _ = draw(params, jax.random.PRNGKey(1))
    assert latents.shape == (10, 8, 8, 4)
    assert objective.latent is not None
    pixels = np.asarray(jax.jit(objective.latent.codec.decode)(latents))
    np.testing.assert_array_equal(np.round(u).astype(np.uint8), pixels)


def test_bad_latent_settings_are_one_line(data, tmp_path):
    pixels = latent_config(data)
    pixels.dataset = ml_collections.ConfigDict({"name": "digits", "batch_size": 4})  # images, not latents
    with pytest.raises(ConfigError, match=r"samples are \(8, 8, 1\); expected raw latents \[h, w, 8\]"):
        build_objective(pixels, open_split(pixels.dataset, "train"))
    missing = tmp_path / "absent.safetensors"
    config = latent_config(data, **{"objective.latent.weights": str(missing)})
    with pytest.raises(ConfigError, match=r"absent\.safetensors.*sd-vae-ft-mse") as info:
        build_objective(config, open_split(config.dataset, "train"))
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"augment\.p=0\.5 is invalid with config\.objective\.latent"):
        config = latent_config(data, **{"objective.augment.p": 0.5})
        build_objective(config, open_split(config.dataset, "train"))
    absent = str(tmp_path / "absent.json")
    config = latent_config(data, **{"objective.latent.scaling_file": absent})
    with pytest.raises(ConfigError, match=r"scaling_file='.*absent\.json': FileNotFoundError") as info:
        build_objective(config, open_split(config.dataset, "train"))
    assert "\n" not in str(info.value)
    three = tmp_path / "three.json"
    three.write_text(json.dumps({"raw_mean": [0.0, 0.0, 0.0, 0.0], "raw_std": [1.0, 1.0, 1.0]}))
    config = latent_config(data, **{"objective.latent.scaling_file": str(three)})
    with pytest.raises(
        ConfigError,
        match=r"three\.json': raw_std=\[1\.0, 1\.0, 1\.0\] is invalid: expected vae_latent_channels=4",
    ):
        build_objective(config, open_split(config.dataset, "train"))
    zero_std = {"objective.latent.scaling_file": "", "objective.latent.raw_std": (1.0, 0.0, 1.0, 1.0)}
    with pytest.raises(ConfigError, match=r"latent\.raw_std=\(1\.0, 0\.0, 1\.0, 1\.0\) is invalid.*> 0"):
        latent_config(data, **zero_std)
    with pytest.raises(ConfigError, match=r"config\.dataset\.path="):
        open_split(latent_config(data, **{"dataset.path": str(tmp_path)}).dataset, "train")


@pytest.mark.slow  # three short runs, each compiling a step, a sampler and the VAE decoder
def test_a_latent_run_resumes_bit_exactly_and_its_pipeline_redraws_the_decoded_preview(data, tmp_path):
    from test_pipeline import Capture

    straight_capture = Capture()
    straight = Trainer(latent_config(data), str(tmp_path / "a"), [straight_capture]).run()
    interrupted = str(tmp_path / "b")
    first = Trainer(latent_config(data, **{"train.num_steps": 2}), interrupted).run()
    assert int(first.step) == 2
    resumed = Trainer(latent_config(data), interrupted).run()
    assert_states_identical(straight, resumed)
    preview = straight_capture.artifacts[("samples", 4)]
    assert preview.images.shape == (10, 32, 32, 3)
    task = dew.pipeline(str(tmp_path / "a"))
    np.testing.assert_array_equal(task().images, preview.images)
