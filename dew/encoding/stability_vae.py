"""EDM2's pixel ↔ latent codec around sd-vae-ft-mse: NVlabs/edm2 ``training/encoders.py``
``StabilityVAEEncoder``, with the haiku VAE of ``dew.networks.sd_vae``.

edm2 separates three representations (NCHW there, NHWC here):

- raw pixels: uint8 images;
- raw latents (what a pre-encoded dataset stores): ``encode_pixels`` runs the VAE encoder on
  the pixels in the convention's range (edm2's pixels / 255: [0, 1]; DiT's, SiT's and REPA's
  [−1, 1]: below) and keeps the posterior's mean and std
  concatenated along channels, [N, h, w, 2·4];
- final latents (what the model sees): ``encode_latents`` draws mean + ε·std (ε standard normal,
  passed in here: the function stays pure) and maps it per channel with
  ``scale = final_std / raw_std``, ``bias = final_mean − raw_mean·scale``, computed in float32
  as edm2 does (``np.float32(final_std) / np.float32(raw_std)``), with edm2's constants
  ``RAW_MEAN = (5.81, 3.25, 0.12, −2.15)``, ``RAW_STD = (4.17, 4.62, 3.71, 3.28)``,
  ``FINAL_MEAN = 0``, ``FINAL_STD = 0.5``.
- ``decode``: (x − bias) / scale, the VAE decoder, then the pixel convention's uint8 rule.

**The latent convention: one rule for encode, decode, the FID protocol and the converters.**
A latent run is two things: its ``LatentScaling`` (raw → final latents, above) and its
``PixelConvention`` (``CONVENTIONS``, ``config.objective.latent.pixels``): which pixel range the
VAE sees, and how the decoder's output y becomes uint8. The codec encodes and decodes by it, the
FID protocol's ``to_uint8`` (``dew.objectives.protocol_presets``, ``dew.scoring.fid_protocol``)
and ``dew.pipeline`` / ``python -m dew.sample`` (``dew.objectives.latent_space``) decode by it,
and ``python -m dew.convert_dit`` refuses a run whose convention is not its checkpoint's.

- ``edm2`` (NVlabs/edm2 ``training/encoders.py``, dew's default): the VAE encodes pixels / 255
  ([0, 1]) and y is read as [0, 1]: uint8 = ``trunc(clamp(y, 0, 1)·255)``.
- ``dit`` (facebookresearch/DiT and willisma/SiT, whose VAE latents are of [−1, 1] images:
  ``train.py``'s ``Normalize(0.5, 0.5)``): the VAE encodes pixels / 127.5 − 1 and y is read as
  [−1, 1]: uint8 = ``trunc(clamp(127.5·y + 128, 0, 255))`` (``sample_ddp.py``; ``sample.py``'s
  ``save_image(normalize=True, value_range=(-1, 1))`` also rounds half up, in other float steps
  that the goldens do not check). dew encodes REPA's u / 127.5 − 1, where DiT's ``ToTensor`` then
  ``Normalize`` compute (u / 255 − 0.5) / 0.5: the same float32 value for all 256 levels.
- ``repa`` (sihyun-yu/REPA: ``preprocessing/encoders.py`` encodes pixels / 127.5 − 1): y read
  as [−1, 1], uint8 = ``trunc(clamp(255·((y + 1)/2), 0, 255))`` (``generate.py``: truncated,
  so one level below DiT's rule wherever the fraction of 127.5·y + 127.5 is ≥ ½: about half
  the pixels).

All three published transformer checkpoints (DiT-XL/2, SiT-XL/2, REPA) sample final latents =
0.18215 · the VAE latent of a [−1, 1] image (``SD_SCALING``: scale 0.18215, bias 0, bit-exact
float32); their decode is ``vae.decode(latents / 0.18215)`` then their rule above.
``tests/test_decode_goldens.py`` checks dew's bytes against the references' own lines
(``third_party/sd_vae/decode_goldens``).
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
SD_SCALE = 0.18215  # DiT's train.py ``.mul_(0.18215)``; SiT's and REPA's latents_scale
#: DiT/SiT/REPA's final latents: 0.18215 · the VAE latent, bias 0 (edm2's arithmetic gives
#: float32(0.5) / float32(0.5 / 0.18215) == float32(0.18215) exactly, and bias 0 − 0·scale = 0)
SD_SCALING = LatentScaling(raw_mean=(0.0,) * 4, raw_std=(FINAL_STD / SD_SCALE,) * 4)
ROUNDINGS = ("truncate", "half_up")


@dataclasses.dataclass(frozen=True)
class PixelConvention:
    """Which pixel range the VAE sees (``signed``: [−1, 1], else [0, 1]) and the uint8 rule for
    its decoded output (``rounding``: ``truncate`` or ``half_up``; module docstring)."""

    name: str
    signed: bool
    rounding: str

    def to_vae(self, pixels: jax.Array) -> jax.Array:
        """uint8 images → the VAE encoder's float32 input: u / 255 or u / 127.5 − 1."""
        x = pixels.astype(jnp.float32)
        return x / 127.5 - 1 if self.signed else x / 255

    def to_uint8(self, y: jax.Array, rounding: str | None = None) -> jax.Array:
        """The decoder's output ``y`` → uint8 by the reference's arithmetic, operation for
        operation; ``rounding`` (default the convention's own) picks the other rule, as a FID
        preset of another reference does (on [0, 1] output, ``half_up`` is DiT's rule on 2y − 1:
        ``trunc(clamp(255·y + 0.5, 0, 255))``)."""
        rounding = self.rounding if rounding is None else rounding
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding={rounding!r} is unknown: expected one of {ROUNDINGS}")
        y = y.astype(jnp.float32)
        if self.signed and rounding == "half_up":  # DiT sample_ddp.py
            u = jnp.clip(127.5 * y + 128.0, 0.0, 255.0)
        elif self.signed:  # REPA generate.py: (y + 1) / 2, then clamp(255 * ·)
            u = jnp.clip(255.0 * ((y + 1.0) / 2.0), 0.0, 255.0)
        elif rounding == "half_up":
            u = jnp.clip(y * 255.0 + 0.5, 0.0, 255.0)
        else:  # edm2 encoders.py: clamp(0, 1).mul(255)
            u = jnp.clip(y, 0.0, 1.0) * 255.0
        return u.astype(jnp.uint8)  # truncation, as torch.Tensor.to(torch.uint8)

    def to_unit(self, y: jax.Array) -> jax.Array:
        """The decoder's output as an image in [0, 1] (float32, clamped)."""
        y = y.astype(jnp.float32)
        return jnp.clip((y + 1.0) / 2.0 if self.signed else y, 0.0, 1.0)


CONVENTIONS = {
    "edm2": PixelConvention("edm2", signed=False, rounding="truncate"),
    "dit": PixelConvention("dit", signed=True, rounding="half_up"),
    "repa": PixelConvention("repa", signed=True, rounding="truncate"),
}


def convention(name: str) -> PixelConvention:
    """``CONVENTIONS[name]``; ``ValueError`` naming the accepted ones."""
    if name not in CONVENTIONS:
        raise ValueError(f"pixels={name!r} is unknown: expected one of {tuple(CONVENTIONS)}")
    return CONVENTIONS[name]


class StabilityVAECodec:
    """``StabilityVAEEncoder`` on haiku params: pure, jittable methods over NHWC arrays.

    ``params`` are both halves of the VAE (``dew.networks.sd_vae_weights.load_weights``);
    ``config`` its shape (sd-vae-ft-mse by default); ``scaling`` raw ↔ final latents; ``pixels``
    the pixel convention (a ``CONVENTIONS`` name: ``edm2`` by default; module docstring)."""

    def __init__(
        self,
        params: hk.Params,
        config: sd_vae.VAEConfig = sd_vae.SD_VAE,
        scaling: LatentScaling = EDM2_SCALING,
        pixels: str = "edm2",
    ):
        self.params, self.config, self.scaling = params, config, scaling
        self.pixels = convention(pixels)

    def encode_pixels(self, pixels: jax.Array) -> jax.Array:
        """uint8 [N, H, W, 3] → raw latents [N, H/8, W/8, 8] (posterior mean ‖ std)."""
        x = self.pixels.to_vae(pixels)
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

    def decode_output(self, latents: jax.Array) -> jax.Array:
        """Final latents → the VAE decoder's output (float32, unclamped, in the convention's range)."""
        return sd_vae.decoder_network(self.config).apply(self.params, self.scaling.unscale(latents))

    def decode_to_unit(self, latents: jax.Array) -> jax.Array:
        """Final latents → the decoded image in [0, 1] (float32, clamped)."""
        return self.pixels.to_unit(self.decode_output(latents))

    def decode(self, latents: jax.Array, rounding: str | None = None) -> jax.Array:
        """Final latents → uint8 pixels by the pixel convention's rule (``rounding``: the other
        rule, ``PixelConvention.to_uint8``)."""
        return self.pixels.to_uint8(self.decode_output(latents), rounding)


__all__ = [
    "CONVENTIONS",
    "EDM2_SCALING",
    "FINAL_MEAN",
    "FINAL_STD",
    "RAW_MEAN",
    "RAW_STD",
    "ROUNDINGS",
    "SD_SCALE",
    "SD_SCALING",
    "LatentScaling",
    "PixelConvention",
    "StabilityVAECodec",
    "convention",
]
