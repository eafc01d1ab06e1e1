"""Denoising score matching with EDM preconditioning (Karras et al. 2022, Eq. 2 and Table 1)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import chex
import haiku as hk
import jax
import jax.numpy as jnp

from dew import registry
from dew.diffusion.process import Process
from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import Condition, Field, InputSpec
from dew.objectives.base import Aux, Batch, Objective, Params, Stats, Step
from dew.sampling import CFG, sample

ModuleFactory = Callable[[], hk.Module]


class Diffusion(Objective):
    """EDM training of a denoiser D(x; σ) = c_skip x + c_out F(c_in x; c_noise, conditions).

    The loss is λ(σ) ‖D(y + n; σ) − y‖² with ln σ ~ N(P_mean, P_std²), averaged over pixels.
    Each condition is dropped (replaced by its unconditional datum) with probability
    ``condition_dropout`` so the same network also serves as the unconditional branch of CFG.
    """

    def __init__(
        self,
        input_spec: InputSpec,
        process: Process,
        model: ModuleFactory,
        encoders: Mapping[str, ModuleFactory],
        condition_dropout: float = 0.0,
    ):
        if not 0.0 <= condition_dropout < 1.0:
            raise ValueError(f"condition_dropout must be in [0, 1), got {condition_dropout}")
        missing = set(input_spec.conditions) - set(encoders)
        if missing:
            raise ValueError(f"Diffusion: no encoder built for conditions {sorted(missing)}")
        self.input_spec = input_spec
        self.process = process
        self.condition_dropout = condition_dropout

        def forward(
            x: jax.Array, noise_level: jax.Array, conditions: Mapping[str, jax.Array], is_training: bool
        ):
            encoded = {k: encoders[k]()(v) for k, v in conditions.items()}
            return model()(x, noise_level, is_training=is_training, **encoded)

        self._net = hk.transform(forward)

    # --- pure pieces --------------------------------------------------------------------------
    def _conditions(self, batch: Batch) -> dict[str, jax.Array]:
        return {k: batch[c.field.name] for k, c in self.input_spec.conditions.items()}

    def denoiser(
        self,
        params: Params,
        conditions: Mapping[str, jax.Array],
        rng: jax.Array | None = None,
        is_training: bool = False,
    ) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """D(x, σ) for fixed conditions; σ may be a scalar or per-example [B]."""

        def denoise(x: jax.Array, sigma: jax.Array) -> jax.Array:
            sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (x.shape[0],))

            def network(x_in: jax.Array, c_noise: jax.Array) -> jax.Array:
                return self._net.apply(params, rng, x_in, c_noise, conditions, is_training)

            return self.process.denoise(network, x, sigma)

        return denoise

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        x = batch[self.input_spec.sample.name]
        return self._net.init(rng, x, jnp.zeros(x.shape[:1]), self._conditions(batch), True)

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        y = batch[self.input_spec.sample.name]
        chex.assert_rank(y, 4)
        sigma_rng, noise_rng, drop_rng, net_rng = jax.random.split(rng, 4)
        sigma = self.process.sample_training_sigma(sigma_rng, y.shape[0])
        noisy = y + jax.random.normal(noise_rng, y.shape, y.dtype) * sigma[:, None, None, None]
        conditions = self._conditions(batch)
        if step.is_training and self.condition_dropout > 0:
            conditions = self._drop(drop_rng, conditions)
        denoised = self.denoiser(params, conditions, net_rng, step.is_training)(noisy, sigma)
        per_example = jnp.mean((denoised - y) ** 2, axis=(1, 2, 3))
        weighted = self.process.loss_weight(sigma) * per_example
        # mse_ is reported at σ-weights of 1: the plain denoising error, comparable across runs.
        return jnp.mean(weighted), ({"mse_denoised": jnp.mean(per_example)}, Aux())

    def _drop(self, rng: jax.Array, conditions: dict[str, jax.Array]) -> dict[str, jax.Array]:
        out = {}
        for (key, value), k in zip(
            sorted(conditions.items()), jax.random.split(rng, len(conditions)), strict=True
        ):
            keep = jax.random.uniform(k, value.shape[:1]) >= self.condition_dropout
            uncond = jnp.full_like(value, self._unconditional(key))
            out[key] = jnp.where(keep.reshape((-1,) + (1,) * (value.ndim - 1)), value, uncond)
        return out

    def _unconditional(self, key: str) -> Any:
        datum = self.input_spec.conditions[key].unconditional
        return UNCONDITIONAL if datum is None else datum

    def generate(
        self,
        params: Params,
        rng: jax.Array,
        conditions: Mapping[str, jax.Array],
        *,
        steps: int,
        solver: str = "heun",
        guidance: CFG | None = None,
    ) -> jax.Array:
        """Samples for the given conditions (one per row), pure and jittable."""
        n = next(iter(conditions.values())).shape[0] if conditions else 1
        shape = (n, *self.input_spec.sample.shape)
        denoise = self.denoiser(params, conditions)
        if guidance is not None:
            uncond = {k: jnp.full_like(v, self._unconditional(k)) for k, v in conditions.items()}
            denoise = guidance(denoise, self.denoiser(params, uncond))
        noise = jax.random.normal(rng, shape, jnp.float32)
        return sample(denoise, noise, self.process.sigmas(steps), solver)

    # --- building from a config, and previews --------------------------------------------------
    @classmethod
    def from_config(cls, config: Any, source: Any) -> Diffusion:
        """Build from ``config.objective``/``config.model`` for a dataset ``source``.

        A source with ``num_classes`` is trained class-conditionally on its ``label`` field.
        """
        image = source.fields["image"]
        sample_field = Field("image", tuple(image.shape[1:]))
        conditions: dict[str, Condition] = {}
        encoders: dict[str, ModuleFactory] = {}
        if source.num_classes:
            conditions["label"] = Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)
            encoder = registry.encoders["class_label"]
            encoders["label"] = functools.partial(encoder, source.num_classes)
        model_cfg = {k: v for k, v in config.model.items() if k != "name"}
        model = functools.partial(registry.models[config.model.name], **model_cfg)
        objective = cls(
            InputSpec(sample_field, conditions),
            registry.presets[config.objective.preset],
            model,
            encoders,
            config.objective.condition_dropout,
        )
        objective.num_classes = source.num_classes
        return objective

    num_classes: int | None = None

    def preview(
        self,
        params: Params,
        rng: jax.Array,
        *,
        per_class: int,
        steps: int,
        solver: str,
        guidance: float = 1.0,
    ) -> tuple[jax.Array, jax.Array]:
        """``per_class`` samples of every class, class-major (one grid row per class)."""
        classes = self.num_classes or 1
        labels = jnp.repeat(jnp.arange(classes, dtype=jnp.int32), per_class)
        conditions = {"label": labels} if self.num_classes else {}
        cfg = CFG(weight=guidance) if guidance != 1.0 else None
        images = self.generate(params, rng, conditions, steps=steps, solver=solver, guidance=cfg)
        return images, labels


registry.objectives.register("diffusion", Diffusion)
