"""Diffusion in a VAE's latent space: ``config.objective.latent`` (EDM2's ImageNet-512 setting).

With ``config.objective.latent.encoder = "stability_vae"`` the data source's sample field holds
*raw* latents, as a pre-encoded data set stores them (``python -m dew.data.sources.latent_dataset``,
read by the ``latent_dataset`` source): the VAE posterior's mean ‖ std, [N, h, w, 2C]. Then

- **training** draws the model's input per step as NVlabs/edm2's ``training_loop.py`` does
  (``images = encoder.encode_latents(images)``, ``StabilityVAEEncoder.encode_latents``): final
  latents = (mean + ε·std)·scale + bias, with ε standard normal from the step's own key
  (``jax.random.fold_in(rng, LATENT_NOISE_STREAM)``; edm2 draws it from torch's global RNG, here
  it is a function of the step's key, so a resumed run draws the same ε as one never
  interrupted); the model learns [h, w, C];
- **previews, ``dew.pipeline`` and ``python -m dew.sample``** decode the sampled latents through
  the VAE decoder to uint8 exactly as the reference of ``pixels`` does (unscale, decode, its
  uint8 rule: edm2's ``generate_images.py`` ``encoder.decode``, ``clamp(0, 1)·255`` truncated;
  DiT's/SiT's ``sample_ddp.py`` ``clamp(127.5·y + 128)``; REPA's ``generate.py``) and hand on
  those images mapped to [−1, 1] (u / 127.5 − 1, which the artifact's PNG maps back to the same
  bytes), so metrics (FID, FD_DINOv2) and ``dew.fid --workdir`` score decoded images.

``pixels`` is the latent convention (``dew.encoding.stability_vae``'s module docstring: one rule
for encode, decode, the FID protocol's ``to_uint8`` and the converters): ``edm2`` (the VAE sees
[0, 1] images, dew's default), ``dit`` (DiT and SiT: [−1, 1]) or ``repa`` ([−1, 1], REPA's
truncating uint8 rule). A data set encoded with one convention trains a model of that one
(``python -m dew.data.sources.latent_dataset --pixels``).

The VAE's weights are read when something first decodes (``LatentSpace.codec``): they are the
published sd-vae-ft-mse safetensors file (``dew.networks.sd_vae_weights.load_weights``, digest-checked;
``weights`` empty means its default path) and its shape the ``vae_*`` keys (sd-vae-ft-mse's by
default; a smaller VAE for tests and CPU runs). Its latent scaling is edm2's ``raw_mean`` /
``raw_std`` (sd-vae-ft-mse's by default) or, for a VAE of one's own, the values measured on its
data and read from ``scaling_file``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dew.encoding.stability_vae import RAW_MEAN, RAW_STD, StabilityVAECodec
from dew.schema import ConfigError, Key, Section

if TYPE_CHECKING:
    from dew.encoding.stability_vae import LatentScaling
    from dew.networks.sd_vae import VAEConfig

LATENT_NOISE_STREAM = 0x1A7E17  # fold_in constant: ε of the latents, apart from the loss's own draws
ENCODERS = ("stability_vae",)

CONFIG = Section(
    "train and sample in a VAE's latent space (the data holds raw latents: mean || std)",
    {
        "encoder": Key(None, "None (pixels) or stability_vae (EDM2's sd-vae-ft-mse codec)", kind=str),
        "weights": Key(
            "",
            "the VAE's diffusion_pytorch_model.safetensors ('': its default path), read only when "
            "something decodes (previews, sampling, FID): training on pre-encoded latents needs none",
        ),
        "allow_unpinned": Key(False, "accept VAE weights whose SHA-256 is not pinned"),
        "pixels": Key(
            "edm2",
            "the latent convention: the VAE's pixel range and uint8 rule: edm2 ([0, 1]), dit "
            "(DiT/SiT: [-1, 1], clamp(127.5y + 128)) or repa ([-1, 1], clamp(255(y + 1)/2))",
            choices=("edm2", "dit", "repa"),
        ),
        "vae_channels": Key((128, 256, 512, 512), "the VAE's block_out_channels", item=int),
        "vae_layers_per_block": Key(2, "the VAE's layers_per_block"),
        "vae_groups": Key(32, "the VAE's norm_num_groups"),
        "vae_latent_channels": Key(4, "the VAE's latent_channels"),
        "raw_mean": Key(
            RAW_MEAN,
            "per-channel mean of the raw latents (edm2's raw_mean; sd-vae-ft-mse's by default)",
            item=float,
        ),
        "raw_std": Key(
            RAW_STD,
            "per-channel std of the raw latents (edm2's raw_std); each > 0",
            item=float,
            check=lambda v: all(s > 0 for s in v),
            accepted="a tuple of floats > 0, one per latent channel",
        ),
        "scaling_file": Key(
            "",
            "a JSON file with raw_mean and raw_std (as experiments/latent_digits_data.py writes for "
            "a VAE dew trained); when set, its values are used instead of raw_mean/raw_std",
        ),
    },
)


class LatentSpace:
    """A codec (``StabilityVAECodec``) seen from a diffusion objective: raw latents in, the
    model's latents for training, decoded images out. ``draw`` is pure (jittable);
    ``to_images`` runs the jitted decoder on the host's samples.

    Built from its shape and scaling, it loads the VAE's weights (``load``) only when something
    decodes (``codec``): training on pre-encoded latents reads no VAE file. ``load`` raises
    ``ConfigError`` naming the weights setting. ``pixels``: the latent convention
    (``dew.encoding.stability_vae``)."""

    def __init__(
        self,
        codec: Any = None,
        *,
        config: Any = None,
        scaling: Any = None,
        load: Callable[[], Any] | None = None,
        pixels: str = "edm2",
    ):
        if codec is None and (config is None or scaling is None or load is None):
            raise ValueError("LatentSpace needs a codec, or its config, scaling and a weights loader")
        self._codec = codec
        self._load = load
        self.config = codec.config if codec is not None else config
        self.scaling = codec.scaling if codec is not None else scaling
        self.pixels = codec.pixels.name if codec is not None else pixels
        # the latent draw needs the scaling alone: a codec without weights
        self._latents = StabilityVAECodec({}, self.config, self.scaling, self.pixels)
        self._decode_fn: Callable[[jax.Array], jax.Array] | None = None

    @property
    def codec(self) -> Any:
        """The whole codec, its VAE weights loaded on first use."""
        if self._codec is None:
            assert self._load is not None  # checked at construction
            self._codec = StabilityVAECodec(self._load(), self.config, self.scaling, self.pixels)
        return self._codec

    @property
    def channels(self) -> int:
        return self.config.latent_channels

    def sample_shape(self, raw_shape: tuple[int, ...]) -> tuple[int, ...]:
        """[h, w, 2C] raw → [h, w, C] model latents; ``ConfigError`` for another channel count."""
        if len(raw_shape) != 3 or raw_shape[-1] != 2 * self.channels:
            raise ConfigError(
                f"config.objective.latent.encoder='stability_vae': the data's samples are {raw_shape}; "
                f"expected raw latents [h, w, {2 * self.channels}] (mean || std, as "
                "python -m dew.data.sources.latent_dataset writes them; source latent_dataset)"
            )
        return (*raw_shape[:-1], self.channels)

    def image_shape(self, sample_shape: tuple[int, ...]) -> tuple[int, int, int]:
        f = self.config.downsampling
        return (sample_shape[0] * f, sample_shape[1] * f, self.config.out_channels)

    def draw(self, raw: jax.Array, rng: jax.Array) -> jax.Array:
        """Final latents from raw ones, ε from ``fold_in(rng, LATENT_NOISE_STREAM)`` (edm2's
        ``encode_latents``)."""
        chex.assert_rank(raw, 4)
        key = jax.random.fold_in(rng, LATENT_NOISE_STREAM)
        noise = jax.random.normal(key, (*raw.shape[:-1], raw.shape[-1] // 2), jnp.float32)
        return self._latents.encode_latents(raw, noise)

    def mean(self, raw: jax.Array) -> jax.Array:
        """The posterior mean's final latents (ε = 0): the shape ``init`` needs."""
        return self._latents.encode_latents(raw, jnp.zeros((*raw.shape[:-1], raw.shape[-1] // 2)))

    def to_images(self, samples: np.ndarray) -> np.ndarray:
        """Sampled latents [n, h, w, C] → decoded images [n, H, W, 3] in [−1, 1] (float32): the
        codec's uint8 decode (its pixel convention's rule), then u / 127.5 − 1."""
        if len(samples) == 0:
            return np.zeros((0, *self.image_shape(samples.shape[1:])), np.float32)
        if self._decode_fn is None:
            self._decode_fn = jax.jit(self.codec.decode)
        pixels = np.asarray(jax.device_get(self._decode_fn(jnp.asarray(samples, jnp.float32))))
        return pixels.astype(np.float32) / 127.5 - 1.0


def from_config(section: Any, decodes: bool = True) -> LatentSpace | None:
    """``config.objective.latent`` → a ``LatentSpace``, or None for pixels. ``decodes``: the run
    decodes while it trains (previews), so its VAE weights are read now and a missing or wrong
    file stops it before anything is written; otherwise they are read when something first
    decodes (``LatentSpace.codec``: a pipeline, sampling, FID), and training needs no VAE file."""
    if section is None or section.encoder is None:
        return None
    if section.encoder not in ENCODERS:
        raise ConfigError(
            f"config.objective.latent.encoder={section.encoder!r} is invalid: expected None or "
            f"one of {ENCODERS}"
        )
    from dew.networks.sd_vae_weights import load_weights

    config = vae_config(section, "config.objective.latent")
    scaling = _scaling(section, config.latent_channels)
    weights, allow_unpinned = section.weights or None, bool(section.allow_unpinned)

    def load() -> Any:
        try:
            return load_weights(weights, allow_unpinned=allow_unpinned, config=config)
        except (OSError, KeyError, ValueError) as e:
            raise ConfigError(f"config.objective.latent.weights={section.weights!r}: {e}") from None

    space = LatentSpace(config=config, scaling=scaling, load=load, pixels=section.pixels)
    if decodes:
        space.codec  # noqa: B018 - read the weights now: their errors before any work
    return space


def decodes_while_training(config: Any) -> bool:
    """Whether a run of ``config`` decodes samples while it trains (previews: ``preview.every``)."""
    return bool(config.preview.every) if "preview" in config and "every" in config.preview else True


def vae_config(section: Any, where: str) -> VAEConfig:
    """The ``vae_*`` keys of ``section`` as a ``dew.networks.sd_vae.VAEConfig``; ``ConfigError``
    naming ``where``."""
    from dew.networks import sd_vae

    try:
        return sd_vae.VAEConfig(
            block_out_channels=tuple(int(c) for c in section.vae_channels),
            layers_per_block=int(section.vae_layers_per_block),
            latent_channels=int(section.vae_latent_channels),
            norm_num_groups=int(section.vae_groups),
        )
    except ValueError as e:
        raise ConfigError(f"{where}.vae_channels={tuple(section.vae_channels)}: {e}") from None


def _scaling(section: Any, channels: int) -> LatentScaling:
    """The ``LatentScaling`` of ``raw_mean``/``raw_std``, or of ``scaling_file``'s when it is set;
    ``ConfigError`` naming the field (or the file), the value and what is accepted."""
    from dew.encoding.stability_vae import LatentScaling

    values = {"raw_mean": section.raw_mean, "raw_std": section.raw_std}
    where = "config.objective.latent."
    if section.scaling_file:
        where = f"config.objective.latent.scaling_file={section.scaling_file!r}: "
        try:
            with open(section.scaling_file) as f:
                measured = json.load(f)
            values = {name: measured[name] for name in values}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{where}{type(e).__name__}: {e}; expected a JSON object with raw_mean and raw_std "
                f"lists (experiments/latent_digits_data.py writes one)"
            ) from None
    for name, value in values.items():
        try:
            value = tuple(float(v) for v in value)
        except (TypeError, ValueError):
            value = None
        if value is None or len(value) != channels or (name == "raw_std" and min(value) <= 0):
            extra = ", each > 0" if name == "raw_std" else ""
            raise ConfigError(
                f"{where}{name}={values[name]!r} is invalid: expected vae_latent_channels={channels} "
                f"floats{extra}, one per latent channel"
            )
        values[name] = value
    return LatentScaling(**values)


__all__ = [
    "CONFIG",
    "LATENT_NOISE_STREAM",
    "LatentSpace",
    "decodes_while_training",
    "from_config",
    "vae_config",
]
