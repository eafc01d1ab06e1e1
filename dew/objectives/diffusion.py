"""Denoising score matching in the EDM frame (Karras et al. 2022, Eq. 2, 7, 8 and Table 1), for
any ``Process`` preset, with class-label or text conditions and condition dropout for CFG."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.augment.settings import AugmentSettings
from dew.diffusion.process import Process
from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import Condition, Field, InputSpec
from dew.objectives import diffusion_augment, latent_space, scatter
from dew.objectives.diffusion_config import CONFIG, Sampling
from dew.objectives.diffusion_sampling import DiffusionSampling
from dew.objectives.diffusion_scoring import DiffusionScoring
from dew.schema import ConfigError, Section
from dew.training.objective import Aux, Batch, Objective, Params, Stats, Step
from dew.training.precision import cast_floats

ModuleFactory = Callable[[], hk.Module]


class Diffusion(DiffusionSampling, DiffusionScoring, Objective):
    """Training of a denoiser D(x; σ) = c_skip x + c_out F(c_in x; c_noise, conditions).

    The loss is λ(σ) ‖D(y + n; σ) − y‖² with σ ~ the process's p_train, averaged over the
    sample's elements (pixels, or coordinates of a vector). Each condition is dropped (replaced by
    its encoder's tokens for the condition's unconditional datum) with probability
    ``condition_dropout`` so the same network also serves as the unconditional branch of CFG.
    ``compute_dtype`` is the dtype the network computes in (``config.precision.compute``).
    """

    precisions = ("float32", "bfloat16", "float16")

    def __init__(
        self,
        input_spec: InputSpec,
        process: Process,
        model: ModuleFactory,
        encoders: Mapping[str, ModuleFactory],
        condition_dropout: float = 0.0,
        *,
        sampling: Sampling | None = None,
        augment: AugmentSettings | None = None,
        augment_labels: bool = False,
        compute_dtype: str = "float32",
    ):
        augment, augment_labels, compute_dtype = self._accept(augment, augment_labels, compute_dtype)
        if not 0.0 <= condition_dropout < 1.0:
            raise ValueError(f"condition_dropout must be in [0, 1), got {condition_dropout}")
        missing = set(input_spec.conditions) - set(encoders)
        if missing:
            raise ValueError(f"Diffusion: no encoder built for conditions {sorted(missing)}")
        self.input_spec = input_spec
        self.process = process
        self.condition_dropout = condition_dropout
        self.compute_dtype = jnp.dtype(compute_dtype)
        self.sampling = sampling or Sampling()
        # EDM's AugmentPipe on training batches (None: off); augment_labels: the net takes them.
        self.augment, self.feeds_augment_labels = augment, augment_labels
        # Jitted draws by their static settings (the preview's among them), so repeated previews
        # and pipeline calls compile once each.
        self._jitted: dict[tuple, Callable[..., Any]] = {}
        self.nonfinite_samples = 0  # in the last preview (see score)
        # The batch-field value of each condition's unconditional datum, from its encoder.
        self._unconditional_tokens = {
            key: registry.encoders[c.encoder].tokens(c.unconditional, c.field.shape)
            for key, c in input_spec.conditions.items()
        }
        self._net = hk.transform(self._forward(model, encoders))

    # --- what a subclass with another network interface replaces ------------------------------
    def _accept(
        self, augment: AugmentSettings | None, augment_labels: bool, compute_dtype: str
    ) -> tuple[AugmentSettings | None, bool, str]:
        """The augmentation, augmentation labels and compute dtype this objective trains with,
        checked before anything else: here all are taken as given; a subclass whose network or
        loss cannot use one raises a ``ConfigError`` naming it."""
        return augment, augment_labels, compute_dtype

    def _forward(self, model: ModuleFactory, encoders: Mapping[str, ModuleFactory]) -> Callable[..., Any]:
        """The function ``hk.transform`` makes ``self._net`` of: (x, noise level, conditions,
        is_training, augment labels or None) -> the network's output, each condition through its
        encoder and passed under its key."""

        def forward(
            x: jax.Array,
            noise_level: jax.Array,
            conditions: Mapping[str, jax.Array],
            is_training: bool,
            augment_labels: jax.Array | None = None,
        ):
            encoded = {k: encoders[k]()(v) for k, v in conditions.items()}
            if augment_labels is not None:
                encoded["augment_labels"] = augment_labels
            return model()(x, noise_level, is_training=is_training, **encoded)

        return forward

    # --- pure pieces --------------------------------------------------------------------------
    def _conditions(self, batch: Batch) -> dict[str, jax.Array]:
        return {k: batch[c.field.name] for k, c in self.input_spec.conditions.items()}

    def denoiser(
        self,
        params: Params,
        conditions: Mapping[str, jax.Array],
        rng: jax.Array | None = None,
        is_training: bool = False,
        augment_labels: jax.Array | None = None,
    ) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """D(x, σ) for fixed conditions; σ may be a scalar or per-example [B]. Without
        ``augment_labels`` an EDM network sees zeros (not augmented), as the reference samples."""

        def denoise(x: jax.Array, sigma: jax.Array) -> jax.Array:
            sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (x.shape[0],))

            def network(x_in: jax.Array, c_noise: jax.Array) -> jax.Array:
                if self.compute_dtype == jnp.float32:
                    return self._net.apply(
                        params, rng, x_in, c_noise, conditions, is_training, augment_labels
                    )
                # The precision policy (docs/precision.md): F runs in the compute dtype on
                # float32 parameters cast at use; c_noise, the σ arithmetic around F (c_in,
                # c_skip, c_out) and the loss stay float32, as EDMPrecond computes them.
                dt = self.compute_dtype
                labels = None if augment_labels is None else augment_labels.astype(dt)
                out = self._net.apply(
                    cast_floats(params, dt), rng, x_in.astype(dt), c_noise, conditions, is_training, labels
                )
                return out.astype(jnp.float32)

            return self.process.denoise(network, x, sigma)

        return denoise

    def training_sample(self, batch: Batch, rng: jax.Array) -> jax.Array:
        """The batch's sample field as the model learns it: the field itself, or in a latent space
        (``config.objective.latent``) final latents drawn from its raw mean ‖ std with ``rng``."""
        y = batch[self.input_spec.sample.name]
        return y if self.latent is None else self.latent.draw(y, rng)

    def init_sample(self, batch: Batch) -> jax.Array:
        """A batch of the model's input shape (the latents' posterior mean in a latent space)."""
        y = batch[self.input_spec.sample.name]
        return y if self.latent is None else self.latent.mean(y)

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        x = self.init_sample(batch)
        return self._net.init(rng, x, jnp.zeros(x.shape[:1]), self._conditions(batch), True)

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        y = self.training_sample(batch, rng)
        chex.assert_shape(y, (None, *self.input_spec.sample.shape))
        sigma_rng, noise_rng, drop_rng, net_rng = jax.random.split(rng, 4)
        augment_labels = None
        if step.is_training:  # EDM's loss.py: y, augment_labels = augment_pipe(images)
            y, augment_labels = diffusion_augment.augmented(self.augment, self.feeds_augment_labels, rng, y)
        sigma = self.process.sample_training_sigma(sigma_rng, y.shape[0])
        per_row = sigma.reshape((-1,) + (1,) * (y.ndim - 1))
        noisy = y + jax.random.normal(noise_rng, y.shape, y.dtype) * per_row
        conditions = self._conditions(batch)
        if step.is_training and self.condition_dropout > 0:
            conditions = self._drop(drop_rng, conditions)
        denoised = self.denoiser(params, conditions, net_rng, step.is_training, augment_labels)(noisy, sigma)
        per_example = jnp.mean((denoised - y) ** 2, axis=tuple(range(1, y.ndim)))
        weighted = self.process.loss_weight(sigma) * per_example
        # mse_ is reported at σ-weights of 1: the plain denoising error, comparable across runs.
        return jnp.mean(weighted), ({"mse_denoised": jnp.mean(per_example)}, Aux())

    def _drop(self, rng: jax.Array, conditions: dict[str, jax.Array]) -> dict[str, jax.Array]:
        out = {}
        for (key, value), k in zip(
            sorted(conditions.items()), jax.random.split(rng, len(conditions)), strict=True
        ):
            keep = jax.random.uniform(k, value.shape[:1]) >= self.condition_dropout
            out[key] = jnp.where(
                keep.reshape((-1,) + (1,) * (value.ndim - 1)), value, self._unconditional(key, value)
            )
        return out

    def _unconditional(self, key: str, like: jax.Array) -> jax.Array:
        """The unconditional datum's tokens, one row per row of ``like``."""
        return jnp.broadcast_to(jnp.asarray(self._unconditional_tokens[key], like.dtype), like.shape)

    # --- config -------------------------------------------------------------------------------------
    @classmethod
    def config_section(cls) -> Section:
        """``config.objective``'s diffusion keys: the preset, conditioning, and ``sampling``
        (how previews are drawn). Every diffusion check lives here, not in the Trainer."""
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> Diffusion:
        """Build from ``config.objective``/``config.model`` for a dataset ``source``.

        ``config.objective.condition`` picks the conditioning: ``text`` (the source's ``text``
        field through the jointly trained ``byte_text`` encoder), ``class_label`` (its ``label``
        field), or ``none``; ``auto`` takes text when the source has a ``text`` field, else class
        labels when it has ``num_classes``. Either is passed to the model under its ``label``
        keyword. ``config.objective.sampling`` sets how ``preview`` samples.
        """
        o = config.objective
        if config.model.name is None:
            raise ConfigError(
                f"config.model.name=None is invalid: the diffusion objective needs a network, one of "
                f"{registry.models.names()}"
            )
        column = source.fields[source.sample_field]
        latent = latent_space.from_config(o.get("latent"))
        shape = tuple(column.shape[1:])
        sample_field = Field(source.sample_field, shape if latent is None else latent.sample_shape(shape))
        if latent is not None and o.augment.p > 0:
            raise ConfigError(
                f"config.objective.augment.p={o.augment.p} is invalid with config.objective.latent: "
                "EDM's AugmentPipe acts on pixels; expected 0"
            )
        choice = o.condition
        if choice == "auto":
            choice = "text" if "text" in source.fields else ("class_label" if source.num_classes else "none")
        if choice == "class_label" and not source.num_classes:
            raise ConfigError(f"config.objective.condition='class_label': {source.name} has no classes")
        if choice == "text" and "text" not in source.fields:
            raise ConfigError(f"config.objective.condition='text': {source.name} has no 'text' field")
        conditions: dict[str, Condition] = {}
        encoders: dict[str, ModuleFactory] = {}
        if choice == "class_label":
            conditions["label"] = Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)
            encoders["label"] = functools.partial(registry.encoders["class_label"], source.num_classes)
        elif choice == "text":
            length = int(source.fields["text"].shape[1])
            conditions["label"] = Condition("byte_text", Field("text", (length,), "int32"), "")
            encoders["label"] = functools.partial(registry.encoders["byte_text"], max_length=length)
        augment, augment_labels = diffusion_augment.from_config(config, sample_field.shape)
        model_cfg = {k: v for k, v in config.model.items() if k != "name"}
        model = functools.partial(registry.models[config.model.name], **model_cfg)
        objective = cls(
            InputSpec(sample_field, conditions),
            registry.presets[o.preset],
            model,
            encoders,
            o.condition_dropout,
            sampling=Sampling(**o.sampling.to_dict()),
            augment=augment,
            augment_labels=augment_labels,
            compute_dtype=config.precision.compute if "precision" in config else "float32",
        )
        objective.num_classes = source.num_classes if conditions else None
        if latent is not None:
            objective.latent = latent
            objective.image_shape = latent.image_shape(sample_field.shape)
        if choice == "text":
            prompts = source.class_prompts or tuple(str(c) for c in range(source.num_classes or 0))
            objective.class_prompts = prompts
        if len(sample_field.shape) == 1:  # points: previews are scatter plots over the data's extent
            objective.extent = scatter.extent_of(np.asarray(column[: min(len(column), 4096)]))
        return objective

    class_prompts: tuple[str, ...] | None = None
    num_classes: int | None = None
    latent: latent_space.LatentSpace | None = None  # config.objective.latent: previews decode
    image_shape: tuple[int, ...] | None = None  # what previews show when it differs from samples
    extent: float | None = None


registry.objectives.register("diffusion", Diffusion)
