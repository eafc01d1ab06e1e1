"""EDM2's pixel ↔ latent codec around sd-vae-ft-mse: NVlabs/edm2 ``training/encoders.py``
``StabilityVAEEncoder``, with the haiku VAE of ``dew.networks.sd_vae``.

edm2 separates three representations (NCHW there, NHWC here):

- raw pixels: uint8 images;
- raw latents (what a pre-encoded dataset stores): ``encode_pixels`` runs the VAE encoder on
  pixels / 255 (edm2 feeds [0, 1], not [−1, 1]) and keeps the posterior's mean and std
  concatenated along channels, [N, h, w, 2·4];
- final latents (what the model sees): ``encode_latents`` draws mean + ε·std (ε standard normal,
  passed in here: the function stays pure) and maps it per channel with
  ``scale = final_std / raw_std``, ``bias = final_mean − raw_mean·scale``, computed in float32
  as edm2 does (``np.float32(final_std) / np.float32(raw_std)``), with edm2's constants
  ``RAW_MEAN = (5.81, 3.25, 0.12, −2.15)``, ``RAW_STD = (4.17, 4.62, 3.71, 3.28)``,
  ``FINAL_MEAN = 0``, ``FINAL_STD = 0.5``.
- ``decode``: (x − bias) / scale, the VAE decoder, then ``clamp(0, 1)·255`` cast to uint8
  (truncation, as ``torch.Tensor.to(torch.uint8)``); ``decode_to_unit`` stops before the cast.
"""

from __future__ import annotations

import dataclasses

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew.networks import sd_vae

RAW_MEAN = (5.81, 3.25, 0.12, -2.15)  # edm2 StabilityVAEEncoder defaults: assumed raw-latent mean
RAW_STD = (4.17, 4.62, 3.71, 3.28)  # ... and standard deviation
FINAL_MEAN = 0.0
FINAL_STD = 0.5


@dataclasses.dataclass(frozen=True)
class LatentScaling:
    """EDM2's per-channel affine map raw → final latents (float32, edm2's arithmetic)."""

    raw_mean: tuple[float, ...] = RAW_MEAN
    raw_std: tuple[float, ...] = RAW_STD
    final_mean: float = FINAL_MEAN
    final_std: float = FINAL_STD

    @property
    def scale(self) -> np.ndarray:
        return np.float32(self.final_std) / np.asarray(self.raw_std, np.float32)

    @property
    def bias(self) -> np.ndarray:
        return np.float32(self.final_mean) - np.asarray(self.raw_mean, np.float32) * self.scale

    def encode_latents(self, raw: jax.Array, noise: jax.Array) -> jax.Array:
        """Raw latents [N, h, w, 2C] (mean ‖ std) and ε [N, h, w, C] → final latents [N, h, w, C]."""
        mean, std = jnp.split(raw.astype(jnp.float32), 2, axis=-1)
        chex.assert_equal_shape([mean, noise])
        x = mean + noise.astype(jnp.float32) * std
        return x * jnp.asarray(self.scale) + jnp.asarray(self.bias)

    def unscale(self, x: jax.Array) -> jax.Array:
        """Final latents → the VAE decoder's input: (x − bias) / scale."""
        return (x.astype(jnp.float32) - jnp.asarray(self.bias)) / jnp.asarray(self.scale)


EDM2_SCALING = LatentScaling()


class StabilityVAECodec:
    """``StabilityVAEEncoder`` on haiku params: pure, jittable methods over NHWC arrays.

    ``params`` are both halves of the VAE (``dew.networks.sd_vae_weights.load_weights``);
    ``config`` its shape (sd-vae-ft-mse by default)."""

    def __init__(
        self,
        params: hk.Params,
        config: sd_vae.VAEConfig = sd_vae.SD_VAE,
        scaling: LatentScaling = EDM2_SCALING,
    ):
        self.params, self.config, self.scaling = params, config, scaling

    def encode_pixels(self, pixels: jax.Array) -> jax.Array:
        """uint8 [N, H, W, 3] → raw latents [N, H/8, W/8, 8] (posterior mean ‖ std)."""
        x = pixels.astype(jnp.float32) / 255
        moments = sd_vae.encoder_network(self.config).apply(self.params, x)
        mean, std = sd_vae.mean_and_std(moments)
        return jnp.concatenate([mean, std], axis=-1)

    def encode_latents(self, raw: jax.Array, noise: jax.Array) -> jax.Array:
        return self.scaling.encode_latents(raw, noise)

    def encode(self, pixels: jax.Array, key: jax.Array) -> jax.Array:
        """Raw pixels → final latents, ε drawn from ``key``."""
        raw = self.encode_pixels(pixels)
        noise = jax.random.normal(key, (*raw.shape[:-1], raw.shape[-1] // 2), jnp.float32)
        return self.encode_latents(raw, noise)

    def decode_to_unit(self, latents: jax.Array) -> jax.Array:
        """Final latents → the decoder's output clamped to [0, 1] (float32)."""
        x = sd_vae.decoder_network(self.config).apply(self.params, self.scaling.unscale(latents))
        return jnp.clip(x, 0.0, 1.0)

    def decode(self, latents: jax.Array) -> jax.Array:
        """Final latents → uint8 pixels, ``clamp(0, 1)·255`` truncated as edm2 casts."""
        return (self.decode_to_unit(latents) * 255).astype(jnp.uint8)


__all__ = [
    "EDM2_SCALING",
    "FINAL_MEAN",
    "FINAL_STD",
    "RAW_MEAN",
    "RAW_STD",
    "LatentScaling",
    "StabilityVAECodec",
]
