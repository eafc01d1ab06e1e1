"""EDM2's training objective (Karras et al. 2024, Eq. 14-16 and 21), NVlabs/edm2
``training/training_loop.py`` ``EDM2Loss``, for the ``edm2`` network (``dew.models["edm2"]``,
its ``Precond``). Registered as ``dew.registry.objectives["edm2"]``.

Per training image y, with ln σ ~ N(P_mean, P_std²) and n ~ N(0, σ² I):

    L = Σ_elements [ λ(σ) / e^{u(σ)} · (D(y + n; σ) − y)² + u(σ) ],   λ(σ) = (σ² + σ_d²) / (σ σ_d)²

(the reference's per-element loss, summed per image: its ``loss.sum() / batch``); the step's loss
is the mean of L over the batch. u(σ) is the network's learned log-variance head. Forced weight
normalisation (Eq. 66) is ``project``: every MPConv weight is re-normalised before each forward
that is differentiated, so the optimizer updates the normalised weights, as the reference's
in-place ``copy_`` does. Sampling, previews, conditioning and condition dropout (EDM's
``label_dropout``; EDM2's recipe trains without it: 0) are the ``diffusion`` objective's; the σ
schedule used for sampling is the preset's (``EDM``: EDM2's generator uses the same).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dew import registry
from dew.contracts.objective import Aux, Batch, Params, Stats, Step
from dew.diffusion.process import Process
from dew.inputs import InputSpec
from dew.networks.edm2_layers import project_weights
from dew.objectives.diffusion import Diffusion, ModuleFactory
from dew.objectives.diffusion_config import CONFIG as DIFFUSION_CONFIG
from dew.objectives.diffusion_config import arguments
from dew.schema import ConfigError, Key, Section

NETWORK = "edm2"
"""The model (and its haiku module name) this objective trains."""

CONFIG = Section(
    "EDM2's uncertainty-weighted denoising loss (Karras et al. 2024), sampled as the diffusion objective",
    {
        **DIFFUSION_CONFIG.keys,
        "P_mean": Key(-0.4, "mean of ln σ during training (EDM2Loss P_mean)"),
        "P_std": Key(
            1.0, "std of ln σ during training (EDM2Loss P_std)", check=lambda v: v > 0, accepted="a float > 0"
        ),
        "sigma_data": Key(
            0.5,
            "σ_data of the loss weight; must equal config.model.sigma_data",
            check=lambda v: v > 0,
            accepted="a float > 0",
        ),
    },
    validate=DIFFUSION_CONFIG.validate,
)


def _is_network_module(module: str) -> bool:
    return module == NETWORK or module.startswith(NETWORK + "/")


class EDM2(Diffusion):
    """The ``diffusion`` objective with EDM2's network interface, loss and weight projection:
    ln σ ~ N(``P_mean``, ``P_std``²) in training and the loss weight's ``sigma_data`` (EDM2Loss's
    arguments); every other argument is the ``diffusion`` objective's."""

    precisions = ("float32", "bfloat16")

    def __init__(
        self,
        input_spec: InputSpec,
        process: Process,
        model: ModuleFactory,
        encoders: Mapping[str, ModuleFactory],
        condition_dropout: float = 0.0,
        *,
        P_mean: float = -0.4,
        P_std: float = 1.0,
        sigma_data: float = 0.5,
        **options: Any,
    ):
        if not (P_std > 0 and sigma_data > 0):
            raise ValueError(f"EDM2: P_std={P_std} and sigma_data={sigma_data} must both be > 0")
        self.P_mean, self.P_std, self.sigma_data = float(P_mean), float(P_std), float(sigma_data)
        super().__init__(input_spec, process, model, encoders, condition_dropout, **options)

    def _accept(self, augment: Any, augment_labels: bool, compute_dtype: str) -> tuple[None, bool, str]:
        """No augmentation, no augmentation labels: EDM2 trains without EDM's AugmentPipe (its
        loss below draws no augmentation), so one is refused rather than ignored
        (``Diffusion.from_config`` hands every diffusion objective these). float32, or bfloat16:
        the U-Net's activations in bfloat16, as the reference's ``use_fp16`` runs them in float16
        on CUDA (the input cast once, each MPConv weight normalised in float32 and cast at use,
        the embeddings, σ arithmetic, log-variance and loss in float32); float16 is the
        reference's own switch, ``config.model.use_fp16``, not this policy."""
        if augment is not None:
            raise ConfigError(
                "config.objective.augment is enabled, which is invalid for the edm2 objective: EDM2 "
                "trains without augmentation; expected config.objective.augment.p=0"
            )
        if jnp.dtype(compute_dtype) not in (jnp.float32, jnp.bfloat16):
            raise ConfigError(
                f"config.precision.compute={compute_dtype!r} is invalid for the edm2 objective: expected "
                "'float32' or 'bfloat16' (float16 is the network's own config.model.use_fp16)"
            )
        self._activations = jnp.dtype(compute_dtype)
        return None, False, compute_dtype

    def _forward(self, model: ModuleFactory, encoders: Mapping[str, ModuleFactory]):
        """(x, σ, conditions, is_training) -> (D(x; σ), u(σ)): the Precond with its log-variance."""

        def forward(x: jax.Array, sigma: jax.Array, conditions: Mapping[str, jax.Array], is_training: bool):
            encoded = {k: encoders[k]()(v) for k, v in conditions.items()}
            network = model()
            activations = self._activations
            return network(
                x, sigma, is_training=is_training, return_logvar=True, activations=activations, **encoded
            )

        return forward

    def denoiser(
        self,
        params: Params,
        conditions: Mapping[str, jax.Array],
        rng: jax.Array | None = None,
        is_training: bool = False,
        augment_labels: jax.Array | None = None,
    ) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """D(x, σ) for fixed conditions: the network's own preconditioning (``Precond``). EDM2's
        network takes no ``augment_labels`` (the objective trains without augmentation)."""
        if augment_labels is not None:
            raise ValueError("edm2: the network takes no augment_labels (EDM2 trains without augmentation)")

        def denoise(x: jax.Array, sigma: jax.Array) -> jax.Array:
            sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (x.shape[0],))
            return self._net.apply(params, rng, x, sigma, conditions, is_training)[0]

        return denoise

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        x = self.init_sample(batch)
        return self._net.init(rng, x, jnp.ones(x.shape[:1]), self._conditions(batch), True)

    def project(self, params: Params) -> Params:
        """Forced weight normalisation (Eq. 66) of the network's MPConv weights."""
        return project_weights(params, _is_network_module)

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        y = self.training_sample(batch, rng)
        chex.assert_shape(y, (None, *self.input_spec.sample.shape))
        sigma_rng, noise_rng, drop_rng, net_rng = jax.random.split(rng, 4)
        sigma = jnp.exp(jax.random.normal(sigma_rng, y.shape[:1]) * self.P_std + self.P_mean)
        per_row = sigma.reshape((-1,) + (1,) * (y.ndim - 1))
        weight = (per_row**2 + self.sigma_data**2) / (per_row * self.sigma_data) ** 2
        noisy = y + jax.random.normal(noise_rng, y.shape, y.dtype) * per_row
        conditions = self._conditions(batch)
        if step.is_training and self.condition_dropout > 0:
            conditions = self._drop(drop_rng, conditions)
        denoised, logvar = self._net.apply(params, net_rng, noisy, sigma, conditions, step.is_training)
        chex.assert_shape(logvar, (y.shape[0], 1, 1, 1))
        squared = (denoised - y) ** 2
        per_element = weight / jnp.exp(logvar) * squared + logvar
        per_image = jnp.sum(per_element, axis=tuple(range(1, y.ndim)))
        stats = {"mse_denoised": jnp.mean(squared), "logvar": jnp.mean(logvar)}
        return jnp.mean(per_image), (stats, Aux())

    @classmethod
    def config_section(cls) -> Section:
        """The diffusion objective's keys plus EDM2Loss's ``P_mean``, ``P_std``, ``sigma_data``."""
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> EDM2:
        """As ``Diffusion.from_config``; the model must be ``edm2`` with the loss's σ_data."""
        o, m = config.objective, config.model
        if m.name != NETWORK:
            raise ConfigError(
                f"config.model.name={m.name!r} is invalid for the edm2 objective: expected {NETWORK!r} "
                "(EDM2's Precond, with the log-variance head its loss needs)"
            )
        if m.sigma_data != o.sigma_data:
            raise ConfigError(
                f"config.objective.sigma_data={o.sigma_data} differs from config.model.sigma_data="
                f"{m.sigma_data}; expected them equal (the loss weight and the preconditioning share it)"
            )
        return cls(**arguments(config, source), P_mean=o.P_mean, P_std=o.P_std, sigma_data=o.sigma_data)


registry.objectives.register("edm2", EDM2)
