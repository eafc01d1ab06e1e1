"""The ``autoencoder`` objective (``dew.objectives.autoencoder``): Stable Diffusion's VAE trained by
dew as a KL-regularised autoencoder, for a latent space of one's own when the published weights
are absent. Its loss is the module docstring's formula, computed here by hand; a few Adam steps
lower it; its export is the published safetensors layout, read back bit for bit by the real
loader; the latent scaling ``experiments/latent_digits_data.py`` measures is edm2's raw mean and
std of mean + ε·std; and bad settings are one line naming the field."""

from __future__ import annotations

import importlib.util
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from helpers_common import ROOT
from PIL import Image

from dew.config import apply_overrides, load_config
from dew.encoding.stability_vae import StabilityVAECodec
from dew.networks import sd_vae
from dew.networks.sd_vae_weights import load_weights
from dew.objectives.autoencoder import Autoencoder, init_params, kl_to_standard_normal
from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer_config import resolve_config

TINY = sd_vae.VAEConfig(block_out_channels=(8, 8), layers_per_block=1, latent_channels=4, norm_num_groups=4)
SHAPE = (8, 8, 3)  # -> 4x4x4 latents
U = 2.0**-24  # float32 unit roundoff

spec = importlib.util.spec_from_file_location(
    "latent_digits_data", ROOT / "experiments" / "latent_digits_data.py"
)
assert spec is not None and spec.loader is not None
data_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(data_script)


def images(n: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).uniform(-1, 1, (n, *SHAPE)), jnp.float32)


def test_kl_is_the_closed_form_for_diagonal_gaussians():
    mean = np.random.default_rng(1).normal(size=(3, 2, 2, 4))
    std = np.exp(np.random.default_rng(2).normal(size=(3, 2, 2, 4)) / 2)
    want = (0.5 * (mean**2 + std**2 - 1 - np.log(std**2))).reshape(3, -1).sum(-1)
    got = kl_to_standard_normal(jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32))
    # 16 terms of a few float32 operations each, then a 16-term sum
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=40 * U * np.abs(want).max() + 40 * U)
    zero = kl_to_standard_normal(jnp.zeros((2, 3)), jnp.ones((2, 3)))
    np.testing.assert_array_equal(np.asarray(zero), np.zeros(2))


def test_loss_is_reconstruction_plus_beta_kl_per_pixel():
    beta = 0.25  # large, so a wrong KL weight or sum would show
    objective = Autoencoder(SHAPE, TINY, beta=beta)
    x = images(3)
    params = objective.init(jax.random.PRNGKey(0), {"image": x})
    key = jax.random.PRNGKey(7)
    loss, (stats, _) = objective.loss(params, key, {"image": x}, Step(jnp.int32(0)))
    # By hand, float64 after the networks. Eagerly (no jit, as the call above ran), each op is its
    # own kernel, so z = mean + std·ε rounded in float32 here is the objective's z bit for bit and
    # the decoder sees the same input; only the loss arithmetic is then left to bound.
    mean32, std32 = (np.asarray(a) for a in objective.posterior(params, x))
    eps32 = np.asarray(jax.random.normal(key, mean32.shape))
    z32 = mean32 + std32 * eps32
    decoded = np.asarray(objective.decode(params, jnp.asarray(z32)), np.float64)
    mean, std, x64 = mean32.astype(np.float64), std32.astype(np.float64), np.asarray(x, np.float64)
    squared = np.square(decoded - x64).reshape(3, -1)
    per_latent = 0.5 * (mean**2 + std**2 - 1 - np.log(std**2))
    kl = per_latent.reshape(3, -1).sum(-1)
    pixels, latents = squared.shape[1], per_latent[0].size  # 192, 64
    want = np.mean((squared.sum(-1) + beta * kl) / pixels)
    # float32: a sum of n terms is within n·u of the sum of their magnitudes; each term is itself
    # a few roundings (difference, square; squares, sum, log: the +10)
    kl_magnitude = (0.5 * (mean**2 + std**2 + 1 + np.abs(np.log(std**2)))).reshape(3, -1).sum(-1)
    tol = ((pixels + 10) * squared.sum(-1).max() + beta * (latents + 10) * kl_magnitude.max()) * U / pixels
    np.testing.assert_allclose(float(loss), want, rtol=0, atol=tol)
    np.testing.assert_allclose(
        float(stats["kl"]), kl.mean(), rtol=0, atol=(latents + 10) * U * kl_magnitude.max()
    )
    mse = squared.mean()
    np.testing.assert_allclose(float(stats["reconstruction"]), mse, rtol=(squared.size + 10) * U)
    psnr = 10 * np.log10(4 / mse)  # d psnr = (10 / ln 10) · d mse / mse, then log10's own rounding
    np.testing.assert_allclose(
        float(stats["psnr"]), psnr, rtol=0, atol=4.35 * (squared.size + 20) * U + 20 * U * psnr
    )


def test_a_few_adam_steps_lower_the_loss_on_a_fixed_batch():
    objective = Autoencoder(SHAPE, TINY, beta=1e-4)
    x = images(8, seed=3)
    params = objective.init(jax.random.PRNGKey(0), {"image": x})
    key = jax.random.PRNGKey(1)  # one ε throughout: the loss is then a fixed function of params
    optimizer = optax.adam(1e-3)

    def loss(p):
        return objective.loss(p, key, {"image": x}, Step(jnp.int32(0)))

    @jax.jit
    def step(p, opt):
        (value, (stats, _)), grads = jax.value_and_grad(loss, has_aux=True)(p)
        updates, opt = optimizer.update(grads, opt, p)
        return optax.apply_updates(p, updates), opt, value, stats["reconstruction"]

    opt = optimizer.init(params)
    losses, recon = [], []
    for _ in range(30):
        params, opt, value, r = step(params, opt)
        losses.append(float(value))
        recon.append(float(r))
    assert losses[-1] < losses[0] and recon[-1] < recon[0], (losses, recon)


def test_the_export_is_the_published_layout_and_reads_back_bit_for_bit(tmp_path):
    """Parameters after a step (not the init's zeros and ones) -> safetensors -> the real loader:
    every array equal, and the codec built from the file encodes and decodes as from memory."""
    objective = Autoencoder(SHAPE, TINY)
    x = images(4, seed=5)
    params = objective.init(jax.random.PRNGKey(2), {"image": x})
    grads = jax.grad(lambda p: objective.loss(p, jax.random.PRNGKey(3), {"image": x}, Step(jnp.int32(0)))[0])(
        params
    )
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    path = str(tmp_path / "vae.safetensors")
    data_script.export_vae(params, path)
    loaded = load_weights(path, allow_unpinned=True, config=TINY)
    assert set(loaded) == set(params)
    for module, leaves in params.items():
        assert set(loaded[module]) == set(leaves), module
        for leaf, value in leaves.items():
            np.testing.assert_array_equal(
                np.asarray(loaded[module][leaf]), np.asarray(value), f"{module}/{leaf}"
            )
    pixels = np.asarray((x + 1) * 127.5, np.uint8)
    from_file, in_memory = StabilityVAECodec(loaded, TINY), StabilityVAECodec(params, TINY)
    raw = jax.jit(from_file.encode_pixels)(pixels)
    np.testing.assert_array_equal(np.asarray(raw), np.asarray(jax.jit(in_memory.encode_pixels)(pixels)))
    z = raw[..., :4]
    np.testing.assert_array_equal(
        np.asarray(jax.jit(from_file.decode)(z)), np.asarray(jax.jit(in_memory.decode)(z))
    )
    with pytest.raises(ValueError, match="not pinned"):
        load_weights(path, config=TINY)


def test_latent_scaling_is_the_mean_and_std_of_mean_plus_eps_std():
    params = init_params(jax.random.PRNGKey(4), TINY)
    codec = StabilityVAECodec(params, TINY)
    pixels = np.random.default_rng(6).integers(0, 256, (10, *SHAPE), dtype=np.uint8)
    got = data_script.latent_scaling(codec, pixels, seed=3, batch=4)
    encode = jax.jit(codec.encode_pixels)
    rng = np.random.default_rng(3)
    z = []
    for i in range(0, 10, 4):  # the same batches, so the same encoder calls, bit for bit
        mean, std = np.split(np.asarray(encode(pixels[i : i + 4]), np.float64), 2, axis=-1)
        z.append((mean + rng.standard_normal(mean.shape) * std).reshape(-1, 4))
    z = np.concatenate(z)
    np.testing.assert_allclose(got["raw_mean"], z.mean(0), rtol=1e-12, atol=1e-12 * np.abs(z).max())
    np.testing.assert_allclose(got["raw_std"], z.std(0), rtol=1e-12)
    # the posterior's spread is in it: not the spread of the means alone
    means = np.split(np.asarray(encode(pixels), np.float64), 2, axis=-1)[0].reshape(-1, 4)
    assert np.all(np.asarray(got["raw_std"]) > means.std(0))


@pytest.fixture
def folder(tmp_path):
    """Six 8x8 RGB PNGs in NVlabs/edm's folder format."""
    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / f"img{i:05d}.png")
    (tmp_path / "dataset.json").write_text(json.dumps({"labels": None}))
    return tmp_path


def autoencoder_config(folder, **overrides):
    config = load_config(str(ROOT / "experiments" / "latent_digits_vae.py"))
    config.dataset = ml_collections.ConfigDict({"name": "image_folder", "batch_size": 2, "path": str(folder)})
    settings = {"objective.vae_channels": (8, 8), "objective.vae_groups": 4, **overrides}
    return resolve_config(apply_overrides(config, [f"config.{k}={v!r}" for k, v in settings.items()]))


def test_the_experiment_config_builds_on_an_image_folder_and_previews_originals_over_reconstructions(folder):
    config = autoencoder_config(folder)
    objective = build_objective(config, open_split(config.dataset, "train"))
    assert isinstance(objective, Autoencoder)
    assert objective.vae == TINY and objective.input_spec.sample.shape == SHAPE
    params = objective.init(jax.random.PRNGKey(0), {})  # the autoencoder's init reads no batch
    grid = objective.preview(params, jax.random.PRNGKey(1))
    assert grid.images.shape == (12, *SHAPE) and grid.columns == 6
    np.testing.assert_array_equal(grid.images[:6], objective.preview_images)
    want = jax.jit(objective.reconstruct)(params, jnp.asarray(objective.preview_images))
    np.testing.assert_array_equal(grid.images[6:], np.asarray(want))  # the same jitted call


@pytest.mark.parametrize(
    "override, message",
    [
        ({"objective.beta": -0.5}, r"config\.objective\.beta=-0\.5 is invalid.*a float >= 0"),
        ({"objective.vae_channels": ()}, r"config\.objective\.vae_channels=\(\) is invalid"),
        ({"objective.vae_layers_per_block": 0}, r"config\.objective\.vae_layers_per_block=0 is invalid"),
        ({"objective.vae_groups": 3}, r"config\.objective\.vae_channels=\(8, 8\).*"),
        ({"objective.vae_channels": (8,) * 5}, r"images are \(8, 8, 3\).*sides a multiple of 16"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(folder, override, message):
    with pytest.raises(ConfigError, match=message) as info:
        config = autoencoder_config(folder, **override)
        build_objective(config, open_split(config.dataset, "train"))
    assert "\n" not in str(info.value)


def test_the_accuracy_script_undoes_the_upsampling_of_real_digits():
    """``latent_digits_accuracy.to_8x8`` of the stored 32×32 RGB digits is the 8×8 digits the
    classifier reads (at the stored uint8 precision)."""
    from dew.data.sources.digits import digits

    spec = importlib.util.spec_from_file_location(
        "latent_digits_accuracy", ROOT / "experiments" / "latent_digits_accuracy.py"
    )
    assert spec is not None and spec.loader is not None
    accuracy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(accuracy)
    x = np.asarray(digits("train").fields["image"][:20], np.float64)
    stored = data_script.upsampled(x).astype(np.float64) / 127.5 - 1.0  # as image_folder reads them
    want = np.round((x + 1.0) * 127.5) / 127.5 - 1.0
    # means of 48 equal float64 values: exact up to a few roundings of values <= 1
    np.testing.assert_allclose(accuracy.to_8x8(stored), want, rtol=0, atol=64 * 2.0**-53)
