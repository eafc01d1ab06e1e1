"""Denoising score matching in the EDM frame (Karras et al. 2022, Eq. 2, 7, 8 and Table 1), for
any ``Process`` preset, with class-label or text conditions and condition dropout for CFG.

``Diffusion`` is built whole by its constructor (``from_config`` computes the arguments:
``diffusion_config.arguments``); how it calls its network (the precision policy, condition
dropout), its sampling, previews and scoring are the pure functions of ``diffusion_network``,
``diffusion_sampling``, ``diffusion_preview`` and ``diffusion_scoring``, called with its own values."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.artifacts import ImageGrid, VideoGrid
from dew.augment.settings import AugmentSettings
from dew.contracts.objective import Aux, Batch, Objective, Params, Stats, Step
from dew.diffusion.process import Process
from dew.inputs import InputSpec
from dew.objectives import (
    diffusion_augment,
    diffusion_network,
    diffusion_preview,
    diffusion_sampling,
    diffusion_scoring,
    latent_space,
)
from dew.objectives.diffusion_config import CONFIG, Sampling, arguments, check_sampling
from dew.objectives.diffusion_network import ModuleFactory as ModuleFactory
from dew.objectives.diffusion_sampling import Denoiser
from dew.objectives.diffusion_scoring import PreviewRecord
from dew.objectives.whole import BuiltWhole
from dew.sampling import CFG, Solver
from dew.schema import Section


class Diffusion(Objective, metaclass=BuiltWhole):
    """Training of a denoiser D(x; σ) = c_skip x + c_out F(c_in x; c_noise, conditions).

    The loss is λ(σ) ‖D(y + n; σ) − y‖² with σ ~ the process's p_train, averaged over the
    sample's elements (pixels, or coordinates of a vector). Each condition is dropped (replaced by
    its encoder's tokens for the condition's unconditional datum) with probability
    ``condition_dropout`` so the same network also serves as the unconditional branch of CFG.
    ``compute_dtype`` is the dtype the network computes in (``config.precision.compute``).

    Built whole (``BuiltWhole``): every attribute comes from the constructor's arguments. What
    previews and inference draw: ``num_classes`` classes (None: unconditional), each with its
    prompt in ``class_prompts`` for a text-conditioned model; in ``latent`` space (decoded by its
    VAE for a person); points shown over [-extent, extent]². Sampling and scoring are the pure
    functions of ``diffusion_sampling``, ``diffusion_preview`` and ``diffusion_scoring``.
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
        num_classes: int | None = None,
        class_prompts: Sequence[str] | None = None,
        latent: latent_space.LatentSpace | None = None,
        extent: float | None = None,
    ):
        augment, augment_labels, compute_dtype = self._accept(augment, augment_labels, compute_dtype)
        if not 0.0 <= condition_dropout < 1.0:
            raise ValueError(f"condition_dropout must be in [0, 1), got {condition_dropout}")
        missing = set(input_spec.conditions) - set(encoders)
        if missing:
            raise ValueError(f"Diffusion: no encoder built for conditions {sorted(missing)}")
        label = input_spec.conditions.get("label")
        if num_classes is not None and label is None:
            raise ValueError(f"Diffusion: num_classes={num_classes} needs a 'label' condition; there is none")
        if class_prompts is not None and (label is None or label.encoder != "byte_text"):
            raise ValueError("Diffusion: class_prompts need a text ('byte_text') 'label' condition")
        self.input_spec = input_spec
        self.process = process
        self.condition_dropout = condition_dropout
        self.compute_dtype = jnp.dtype(compute_dtype)
        self.sampling = sampling or Sampling()
        # EDM's AugmentPipe on training batches (None: off); augment_labels: the net takes them.
        self.augment, self.feeds_augment_labels = augment, augment_labels
        self.num_classes = num_classes
        self.class_prompts = None if class_prompts is None else tuple(class_prompts)
        self.latent = latent  # config.objective.latent: previews decode
        self.extent = extent  # points: the scatter plot's half-width (None: the samples' own)
        # Jitted draws by their static settings (the preview's among them), so repeated previews
        # and pipeline calls compile once each; and what the last preview leaves for ``score``.
        self._jitted: dict[tuple, Callable[..., Any]] = {}
        self._last_preview = PreviewRecord()
        # The batch-field value of each condition's unconditional datum, from its encoder.
        self._unconditional_tokens = {
            key: registry.encoders[c.encoder].tokens(c.unconditional, c.field.shape)
            for key, c in input_spec.conditions.items()
        }
        self._net = hk.transform(self._forward(model, encoders))

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        """What previews show when it differs from the samples: a latent run's decoded images."""
        if self.latent is None:
            return None
        return self.latent.image_shape(self.input_spec.sample.shape)

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
        encoder and passed under its key (``diffusion_network.conditioned_forward``)."""
        return diffusion_network.conditioned_forward(model, encoders)

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
        ``augment_labels`` an EDM network sees zeros (not augmented), as the reference samples.
        The network runs in ``compute_dtype`` under the precision policy
        (``diffusion_network.precision_denoiser``)."""
        return diffusion_network.precision_denoiser(
            self._net.apply,
            self.process,
            self.compute_dtype,
            params,
            conditions,
            rng,
            is_training,
            augment_labels,
        )

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
        """Condition dropout for CFG at ``condition_dropout`` (``diffusion_network.drop_conditions``)."""
        return diffusion_network.drop_conditions(
            rng, conditions, self.condition_dropout, self._unconditional_tokens
        )

    def _unconditional(self, key: str, like: jax.Array) -> jax.Array:
        """The unconditional datum's tokens, one row per row of ``like``."""
        return diffusion_sampling.unconditional(self._unconditional_tokens[key], like)

    # --- sampling (diffusion_sampling's pure functions, given this model's pieces) ---------------
    def guided_denoiser(
        self,
        params: Params,
        conditions: Mapping[str, jax.Array],
        guidance: CFG | None = None,
        guide: Diffusion | None = None,
        guide_params: Params | None = None,
    ) -> Denoiser:
        """The denoiser ``generate`` samples with: this network's D(x, σ) for ``conditions``,
        guided (``guidance``) against its unconditional prediction, or against ``guide``'s
        prediction for the same conditions when a guide is given (autoguidance)."""

        def reference() -> Denoiser:
            if guide is not None:
                return guide.denoiser(guide_params, conditions)
            return self.denoiser(params, {k: self._unconditional(k, v) for k, v in conditions.items()})

        return diffusion_sampling.guided(self.denoiser(params, conditions), guidance, reference)

    def generate(
        self,
        params: Params,
        rng: jax.Array,
        conditions: Mapping[str, jax.Array],
        *,
        steps: int,
        solver: str | Solver = "heun",
        guidance: CFG | None = None,
        num_samples: int | None = None,
        guide: Diffusion | None = None,
        guide_params: Params | None = None,
    ) -> jax.Array:
        """Samples for the given conditions (one per row), pure and jittable.

        Without conditions, ``num_samples`` says how many. The initial noise is drawn from
        ``rng`` itself; a stochastic solver's per-step noise from ``fold_in(rng, 1)``.

        ``guidance`` guides against this network's unconditional prediction (CFG), or, with a
        ``guide`` objective and its ``guide_params``, against the guide's prediction for the same
        conditions (autoguidance, Karras et al. 2024, "Guiding a diffusion model with a bad
        version of itself": D = D_guide + w (D − D_guide), inside the guidance interval).
        """
        n = next(iter(conditions.values())).shape[0] if conditions else (num_samples or 1)
        denoise = self.guided_denoiser(params, conditions, guidance, guide, guide_params)
        with jax.ensure_compile_time_eval():  # a schedule sample can check, even under jit
            sigmas = self.process.sigmas(steps)
        return diffusion_sampling.from_noise(denoise, rng, (n, *self.input_spec.sample.shape), sigmas, solver)

    def draw(
        self,
        params: Params,
        rng: jax.Array,
        *,
        per_class: int,
        steps: int,
        solver: str,
        guidance: float = 1.0,
        guidance_interval: tuple[float, float] | tuple[()] = (),
        guide: Diffusion | None = None,
        guide_params: Params | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """``per_class`` samples of every class, class-major, and their labels; pure and jittable.

        ``guidance`` is the CFG weight (1 = none), applied only while σ lies in
        ``guidance_interval`` = (σ_lo, σ_hi] when one is given, else over the whole σ range."""
        tokens = None
        if self.num_classes and self.class_prompts is not None:  # text-conditioned: each class's prompt
            tokens = diffusion_sampling.prompt_tokens(
                self.class_prompts, self.input_spec.conditions["label"].field.shape
            )
        conditions, labels = diffusion_sampling.class_rows(per_class, self.num_classes, tokens)
        samples = self.generate(
            params,
            rng,
            conditions,
            steps=steps,
            solver=solver,
            guidance=diffusion_sampling.interval_guidance(guidance, guidance_interval),
            num_samples=per_class,
            guide=guide,
            guide_params=guide_params,
        )
        return samples, labels

    # --- what a person sees (diffusion_preview, diffusion_scoring) -------------------------------
    def preview(self, params: Params, rng: jax.Array) -> ImageGrid | VideoGrid:
        """Samples as ``config.objective.sampling`` asks: an ``ImageGrid`` with one row per class
        for images (captioned with each row's prompt for text conditions), a ``VideoGrid`` for
        clips, a scatter plot (one ``ImageGrid`` picture) for points. Non-finite samples are
        drawn grey or saturated and counted for ``score``."""
        s = self.sampling
        draw = diffusion_preview.jitted_once(self._jitted, ("draw", s), self.draw, **dataclasses.asdict(s))
        samples, _ = jax.device_get(draw(params, rng))
        samples, nonfinite = diffusion_preview.finite_samples(samples)
        self._last_preview.nonfinite = nonfinite
        captions = diffusion_sampling.class_captions(self.class_prompts, s.per_class)
        return self._artifact(samples, captions, s.per_class)

    def _artifact(self, samples: np.ndarray, captions: tuple[str, ...] | None, columns: int) -> Any:
        latent, extent = self.latent, self.extent
        return diffusion_preview.to_artifact(samples, captions, columns, latent=latent, extent=extent)

    def score(self, preview: Any, metrics: Mapping[str, Callable[..., float]]) -> dict[str, float]:
        """``metric(images, labels)`` for each named metric on an image preview, the labels being
        the classes the rows were asked for; when the last preview held non-finite samples, no
        metric is asked (classifiers refuse NaN) and ``nonfinite_samples`` is reported instead."""
        return diffusion_scoring.preview_scores(
            preview,
            metrics,
            sample_shape=self.input_spec.sample.shape,
            num_classes=self.num_classes,
            per_class=self.sampling.per_class,
            nonfinite=self._last_preview.nonfinite,
        )

    # --- inference (dew.pipeline) ---------------------------------------------------------------
    def inference_options(self) -> dict[str, Any]:
        """What ``dew.pipeline`` accepts; the defaults are the run's preview settings."""
        s = self.sampling
        return {
            "classes": None,
            "prompts": None,
            "per_class": s.per_class,
            "steps": s.steps,
            "solver": s.solver,
            "guidance": s.guidance,
            "guidance_interval": s.guidance_interval,
            "seed": 0,
        }

    def infer(
        self,
        params: Params,
        *,
        classes,
        prompts,
        per_class: int,
        steps: int,
        solver: str,
        guidance: float,
        guidance_interval: tuple[float, ...],
        seed: int,
        guide: Diffusion | None = None,
        guide_params: Params | None = None,
    ) -> Any:
        """Samples as an artifact. Without ``classes`` or ``prompts``: ``per_class`` of every
        class, drawn exactly as ``preview`` draws them (``seed`` = the run's seed with the
        defaults reproduces its previews bit for bit). ``classes`` (class labels) or ``prompts``
        (captions, for a text-conditioned model): one sample per entry. ``guidance`` is the CFG
        weight (1: none), applied to the condition only for σ in ``guidance_interval`` =
        (σ_lo, σ_hi] when one is given; ``solver`` a registered sampler, ``steps`` its σ points.
        ``guide``/``guide_params`` (``dew.pipeline(..., guide=...)``): guide against that
        network's prediction for the same conditions instead (autoguidance)."""
        settings = Sampling(
            steps=steps,
            solver=solver,
            per_class=per_class,
            guidance=guidance,
            guidance_interval=tuple(guidance_interval),
        )
        check_sampling(settings)
        rng = jax.random.PRNGKey(seed)
        if classes is None and prompts is None:
            if settings == self.sampling and guide is None:
                return self.preview(params, rng)
            key = ("draw", settings, id(guide))
            static = {**dataclasses.asdict(settings), "guide": guide}
            draw = diffusion_preview.jitted_once(self._jitted, key, self.draw, **static)
            samples, _ = jax.device_get(draw(params, rng, guide_params=guide_params))
            captions = diffusion_sampling.class_captions(self.class_prompts, per_class)
            return self._artifact(samples, captions, per_class)
        conditions, captions = diffusion_sampling.requested_conditions(
            classes,
            prompts,
            condition=self.input_spec.conditions.get("label"),
            num_classes=self.num_classes,
            class_prompts=self.class_prompts,
        )
        cfg = diffusion_sampling.interval_guidance(guidance, settings.guidance_interval)
        draw = diffusion_preview.jitted_once(
            self._jitted,
            ("generate", steps, solver, cfg, id(guide)),
            self.generate,
            steps=steps,
            solver=solver,
            guidance=cfg,
            guide=guide,
        )
        samples = jax.device_get(draw(params, rng, conditions, guide_params=guide_params))
        return self._artifact(samples, captions, min(len(samples), 10))

    # --- config -------------------------------------------------------------------------------------
    @classmethod
    def config_section(cls) -> Section:
        """``config.objective``'s diffusion keys: the preset, conditioning, and ``sampling``
        (how previews are drawn). Every diffusion check lives here, not in the Trainer."""
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> Diffusion:
        """Built from ``config.objective``/``config.model`` for a dataset ``source``, with the
        constructor arguments ``diffusion_config.arguments`` computes (the conditioning, the
        network, the latent space, the preview's classes and extent)."""
        return cls(**arguments(config, source))


registry.objectives.register("diffusion", Diffusion)
