"""A KL-regularised autoencoder (Kingma & Welling 2014; the first stage of latent diffusion,
Rombach et al. 2022) with Stable Diffusion's own VAE (``dew.networks.sd_vae``) at a given shape.

Conventions follow the codec that later encodes with it (``dew.encoding.stability_vae``): the
encoder sees the ``image`` field mapped from [-1, 1] to [0, 1] (edm2 feeds pixels / 255), and the
decoder's output y is read as an image in [0, 1]; the loss compares x̂ = 2y - 1 with x in
[-1, 1]. Per image of D pixel values, with the posterior N(μ, σ²) from ``encode_moments`` and
``mean_and_std`` and z = μ + σ·ε (ε from the step's key, the reparameterised sample):

    loss = [ Σ_pixels (x̂(z) - x)² + beta · Σ_latent ½(μ² + σ² - 1 - log σ²) ] / D,

averaged over the batch. Reconstruction is **MSE**, not L1: the decoded previews are judged as
pixels, PSNR is a function of it, and sd-vae-ft-mse (the VAE this one stands in for) was
fine-tuned on MSE. Both sums are per image, as latent diffusion's ``LPIPSWithDiscriminator``
sums them, so ``beta`` is on the scale of its ``kl_weight`` (1e-6); the default 1e-4 is larger
because this VAE has no perceptual or adversarial term to keep its latents regular: it still
weighs the KL at < 1 % of the reconstruction term at the errors this VAE reaches (so
reconstructions stay sharp), while bounding the latents' scale and keeping σ off zero, which is
what a diffusion model then learns on. Stats: ``reconstruction`` (the per-pixel MSE on [-1, 1]),
``kl`` (per image, summed over latent elements) and ``psnr`` (dB, peak-to-peak 2).

Parameters are the union of both halves' haiku params (the names ``torch_state_dict`` exports),
initialised here: GroupNorm scale 1 and offset 0, biases 0, kernels N(0, 1/fan_in).

Precision (``config.precision.compute``, ``docs/precision.md``): under bfloat16 each half
computes on its float32 parameters cast at use, its input cast on entry
(``dew.contracts.precision.compute_in``; ``dew.networks.sd_vae`` keeps its GroupNorms and
attention softmax in float32), and returns float32: the posterior's clipping and exp, the
reparameterised draw, the reconstruction error, the KL and the loss are float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.artifacts import ImageGrid
from dew.contracts.objective import Aux, Batch, Objective, Params, Stats, Step
from dew.contracts.precision import compute_dtype_of, compute_in
from dew.inputs import Field, InputSpec
from dew.networks import sd_vae
from dew.objectives.latent_space import vae_config
from dew.objectives.whole import BuiltWhole
from dew.schema import ConfigError, Key, Section, at_least

PREVIEW_IMAGES = 20  # held-out images in the preview: a row of originals over their reconstructions


def kl_to_standard_normal(mean: jax.Array, std: jax.Array) -> jax.Array:
    """KL(N(mean, std²) ‖ N(0, 1)) summed over all but the batch axis: [B, ...] -> [B]."""
    per = 0.5 * (jnp.square(mean) + jnp.square(std) - 1.0 - 2.0 * jnp.log(std))
    return jnp.sum(per.reshape(per.shape[0], -1), axis=-1)


def init_params(rng: jax.Array, config: sd_vae.VAEConfig) -> Params:
    """Both halves' params (module docstring's init), deterministic in ``rng``."""
    shapes = sd_vae.expected_shapes(config)
    params: dict[str, dict[str, jax.Array]] = {}
    for i, module in enumerate(sorted(shapes)):
        out = {}
        for leaf, shape in shapes[module].items():
            if leaf == "scale":
                out[leaf] = jnp.ones(shape, jnp.float32)
            elif leaf == "w":
                fan_in = int(np.prod(shape[:-1]))
                out[leaf] = jax.random.normal(jax.random.fold_in(rng, i), shape) / np.sqrt(fan_in)
            else:
                out[leaf] = jnp.zeros(shape, jnp.float32)
        params[module] = out
    return params


def half(params: Params, prefixes: tuple[str, ...]) -> Params:
    """The modules of ``params`` whose haiku names start with one of ``prefixes``."""
    return {module: leaves for module, leaves in params.items() if module.startswith(prefixes)}


ENCODER = ("encoder__", "quant_conv")  # the haiku modules of encode_moments
DECODER = ("decoder__", "post_quant_conv")  # ... and of decode


class Autoencoder(Objective, metaclass=BuiltWhole):
    """Trains ``sd_vae``'s encoder and decoder at ``vae`` on the ``image`` field (module
    docstring); ``compute_dtype`` (float32 or bfloat16) is the dtype both halves compute in."""

    precisions = ("float32", "bfloat16")

    def __init__(
        self,
        image_shape: tuple[int, ...],
        vae: sd_vae.VAEConfig,
        beta: float = 1e-4,
        preview_images: np.ndarray | None = None,
        compute_dtype: str = "float32",
    ):
        if not beta >= 0:
            raise ValueError(f"Autoencoder: beta={beta} is invalid; expected a float >= 0")
        self.input_spec = InputSpec(Field("image", tuple(image_shape)))
        self.vae, self.beta, self.preview_images = vae, float(beta), preview_images
        # the precision policy: each half on its own parameters, cast at use
        self.compute_dtype = jnp.dtype(compute_dtype)
        encoder, decoder = sd_vae.encoder_network(vae), sd_vae.decoder_network(vae)
        self._encode = compute_in(lambda p, _, x: encoder.apply(p, x), self.compute_dtype)
        self._decode = compute_in(lambda p, _, z: decoder.apply(p, z), self.compute_dtype)

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        del batch
        return init_params(rng, self.vae)

    def posterior(self, params: Params, images: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Images in [-1, 1] -> the posterior's (mean, std), [B, h, w, latent] each."""
        moments = self._encode(half(params, ENCODER), None, (images + 1.0) / 2.0)
        return sd_vae.mean_and_std(moments)

    def decode(self, params: Params, z: jax.Array) -> jax.Array:
        """Latents -> images on the [-1, 1] scale (2y - 1 of the decoder's output y, unclipped)."""
        return 2.0 * self._decode(half(params, DECODER), None, z) - 1.0

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        del step
        images = batch["image"]
        chex.assert_shape(images, (None, *self.input_spec.sample.shape))
        mean, std = self.posterior(params, images)
        z = mean + std * jax.random.normal(rng, mean.shape)
        err = jnp.square(self.decode(params, z) - images).reshape(images.shape[0], -1)
        kl = kl_to_standard_normal(mean, std)
        pixels = err.shape[-1]
        loss = jnp.mean((jnp.sum(err, axis=-1) + self.beta * kl) / pixels)
        mse = jnp.mean(err)
        stats = {"reconstruction": mse, "kl": jnp.mean(kl), "psnr": 10.0 * jnp.log10(4.0 / mse)}
        return loss, (stats, Aux())

    def reconstruct(self, params: Params, images: jax.Array) -> jax.Array:
        """Images in [-1, 1] -> decoded posterior means, clipped to [-1, 1]."""
        mean, _ = self.posterior(params, images)
        return jnp.clip(self.decode(params, mean), -1.0, 1.0)

    def generate(self, params: Params, rng: jax.Array, images: jax.Array) -> jax.Array:
        del rng
        return self.reconstruct(params, images)

    # --- config ----------------------------------------------------------------------------------
    @classmethod
    def config_section(cls) -> Section:
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> Autoencoder:
        """Build for an image source (``image`` field); the preview's images are the validation
        split's first ``PREVIEW_IMAGES``."""
        from dew.data.splits import open_split

        if "image" not in source.fields:
            raise ConfigError(
                f"config.dataset.name={config.dataset.name!r}: the autoencoder objective needs an "
                f"'image' field, {source.name} has {sorted(source.fields)}"
            )
        o = config.objective
        vae = vae_config(o, "config.objective")
        shape = tuple(source.fields["image"].shape[1:])
        if shape[-1] != vae.in_channels or shape[0] % vae.downsampling or shape[1] % vae.downsampling:
            raise ConfigError(
                f"config.dataset: images are {shape}; the VAE at config.objective.vae_channels="
                f"{tuple(o.vae_channels)} needs {vae.in_channels} channels and sides a multiple of "
                f"{vae.downsampling}"
            )
        held = open_split(config.dataset, "validation").fields["image"][:PREVIEW_IMAGES]
        return cls(
            shape,
            vae,
            beta=o.beta,
            preview_images=np.asarray(held, np.float32),
            compute_dtype=compute_dtype_of(config),
        )

    # --- inference ------------------------------------------------------------------------------
    def inference_options(self) -> dict[str, Any]:
        return {"images": None}

    def infer(self, params: Params, *, images=None) -> ImageGrid:
        """Reconstructions of ``images`` [N, H, W, C] in [-1, 1] (default: the preview's)."""
        images = self.preview_images if images is None else np.asarray(images, np.float32)
        if images is None or images.shape[1:] != self.input_spec.sample.shape:
            raise ValueError(f"images must be [N, *{self.input_spec.sample.shape}] in [-1, 1]")
        return ImageGrid(np.asarray(_reconstruct_jit(self)(params, jnp.asarray(images))))

    def preview(self, params: Params, rng: jax.Array) -> ImageGrid:
        """Originals (top row) over their reconstructions (bottom row)."""
        del rng
        if self.preview_images is None:
            raise ValueError("Autoencoder.preview needs preview_images")
        recon = np.asarray(_reconstruct_jit(self)(params, jnp.asarray(self.preview_images)))
        grid = np.concatenate([self.preview_images, recon]).clip(-1.0, 1.0)
        return ImageGrid(grid, columns=len(self.preview_images))

    def score(self, preview: Any, metrics: Mapping[str, Callable[..., float]]) -> dict[str, float]:
        return super().score(preview, metrics)


CONFIG = Section(
    "a KL-regularised autoencoder (Stable Diffusion's VAE shape): MSE + beta * KL to N(0, I)",
    {
        "beta": Key(
            1e-4,
            "weight of the KL term (per-image sums, as latent diffusion's kl_weight)",
            **at_least(0, "a float >= 0"),
        ),
        "vae_channels": Key(
            (32, 32, 64),
            "the VAE's block_out_channels (default: experiments/latent_digits_vae.py's)",
            item=int,
            check=lambda v: len(v) >= 1 and all(c >= 1 for c in v),
            accepted="a non-empty tuple of ints >= 1",
        ),
        "vae_layers_per_block": Key(1, "the VAE's layers_per_block", **at_least(1, "an int >= 1")),
        "vae_groups": Key(8, "the VAE's norm_num_groups", **at_least(1, "an int >= 1")),
        "vae_latent_channels": Key(4, "the VAE's latent_channels", **at_least(1, "an int >= 1")),
    },
)


@functools.lru_cache(maxsize=4)
def _reconstruct_jit(objective: Autoencoder):
    return jax.jit(objective.reconstruct)


registry.objectives.register("autoencoder", Autoencoder)

__all__ = ["CONFIG", "DECODER", "ENCODER", "Autoencoder", "half", "init_params", "kl_to_standard_normal"]
