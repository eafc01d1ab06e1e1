"""Denoising score matching in the EDM frame (Karras et al. 2022, Eq. 2, 7, 8 and Table 1), for
any ``Process`` preset, with class-label or text conditions and condition dropout for CFG."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.artifacts import ImageGrid, VideoGrid
from dew.augment.settings import AugmentSettings
from dew.diffusion.process import Process
from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import Condition, Field, InputSpec
from dew.objectives import diffusion_augment, latent_space, scatter
from dew.objectives.diffusion_config import CONFIG, Sampling, check_sampling
from dew.sampling import CFG, Solver, sample
from dew.schema import ConfigError, Section
from dew.training.objective import Aux, Batch, Objective, Params, Stats, Step

ModuleFactory = Callable[[], hk.Module]


class Diffusion(Objective):
    """Training of a denoiser D(x; σ) = c_skip x + c_out F(c_in x; c_noise, conditions).

    The loss is λ(σ) ‖D(y + n; σ) − y‖² with σ ~ the process's p_train, averaged over the
    sample's elements (pixels, or coordinates of a vector). Each condition is dropped (replaced by
    its encoder's tokens for the condition's unconditional datum) with probability
    ``condition_dropout`` so the same network also serves as the unconditional branch of CFG.
    """

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
    ):
        if not 0.0 <= condition_dropout < 1.0:
            raise ValueError(f"condition_dropout must be in [0, 1), got {condition_dropout}")
        missing = set(input_spec.conditions) - set(encoders)
        if missing:
            raise ValueError(f"Diffusion: no encoder built for conditions {sorted(missing)}")
        self.input_spec = input_spec
        self.process = process
        self.condition_dropout = condition_dropout
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
        augment_labels: jax.Array | None = None,
    ) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """D(x, σ) for fixed conditions; σ may be a scalar or per-example [B]. Without
        ``augment_labels`` an EDM network sees zeros (not augmented), as the reference samples."""

        def denoise(x: jax.Array, sigma: jax.Array) -> jax.Array:
            sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (x.shape[0],))

            def network(x_in: jax.Array, c_noise: jax.Array) -> jax.Array:
                return self._net.apply(params, rng, x_in, c_noise, conditions, is_training, augment_labels)

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

    def guided_denoiser(
        self,
        params: Params,
        conditions: Mapping[str, jax.Array],
        guidance: CFG | None = None,
        guide: Diffusion | None = None,
        guide_params: Params | None = None,
    ) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """The denoiser ``generate`` samples with: this network's D(x, σ) for ``conditions``,
        guided (``guidance``) against its unconditional prediction, or against ``guide``'s
        prediction for the same conditions when a guide is given (autoguidance)."""
        denoise = self.denoiser(params, conditions)
        if guidance is None:
            return denoise
        if guide is not None:
            return guidance(denoise, guide.denoiser(guide_params, conditions))
        uncond = {k: self._unconditional(k, v) for k, v in conditions.items()}
        return guidance(denoise, self.denoiser(params, uncond))

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
        shape = (n, *self.input_spec.sample.shape)
        denoise = self.guided_denoiser(params, conditions, guidance, guide, guide_params)
        noise = jax.random.normal(rng, shape, jnp.float32)
        with jax.ensure_compile_time_eval():  # a schedule sample can check, even under jit
            sigmas = self.process.sigmas(steps)
        return sample(denoise, noise, sigmas, solver, rng=jax.random.fold_in(rng, 1))

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

    # --- previews -----------------------------------------------------------------------------------
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
        classes = self.num_classes or 1
        labels = jnp.repeat(jnp.arange(classes, dtype=jnp.int32), per_class)
        conditions = {}
        if self.num_classes:
            conditions = {"label": labels}
            if self.class_prompts is not None:  # text-conditioned: each class's prompt
                field = self.input_spec.conditions["label"].field
                prompts = np.stack(
                    [registry.encoders["byte_text"].tokens(p, field.shape) for p in self.class_prompts]
                )
                conditions = {"label": jnp.asarray(prompts)[labels]}
        lo, hi = guidance_interval or (0.0, float("inf"))
        cfg = CFG(weight=guidance, sigma_lo=lo, sigma_hi=hi) if guidance != 1.0 else None
        samples = self.generate(
            params,
            rng,
            conditions,
            steps=steps,
            solver=solver,
            guidance=cfg,
            num_samples=per_class,
            guide=guide,
            guide_params=guide_params,
        )
        return samples, labels

    def preview(self, params: Params, rng: jax.Array) -> ImageGrid | VideoGrid:
        """Samples as ``config.objective.sampling`` asks: an ``ImageGrid`` with one row per class
        for images (captioned with each row's prompt for text conditions), a ``VideoGrid`` for
        clips, a scatter plot (one ``ImageGrid`` picture) for points."""
        draw = self._jitted_once(("draw", self.sampling), self.draw, **dataclasses.asdict(self.sampling))
        samples, _ = jax.device_get(draw(params, rng))
        # A diverged model samples NaN or inf: drawn grey (NaN) or saturated (inf), counted, and
        # reported by ``score`` instead of being handed to metrics that cannot take them.
        finite = np.isfinite(samples.reshape(len(samples), -1)).all(axis=1)
        self.nonfinite_samples = int(np.sum(~finite))
        samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
        captions = None
        if self.class_prompts is not None:
            captions = tuple(p for p in self.class_prompts for _ in range(self.sampling.per_class))
        return self._artifact(samples, captions, self.sampling.per_class)

    def _artifact(self, samples: np.ndarray, captions: tuple[str, ...] | None, columns: int) -> Any:
        if self.latent is not None:  # sampled latents -> the VAE decoder's images in [-1, 1]
            samples = self.latent.to_images(samples)
        if samples.ndim == 2:
            return scatter.scatter_grid(samples, self.extent or scatter.extent_of(samples))
        if samples.ndim == 5:
            return VideoGrid(np.clip(samples, -1.0, 1.0), fps=4)
        return ImageGrid(np.clip(samples, -1.0, 1.0), captions=captions, columns=columns)

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
            draw = self._jitted_once(key, self.draw, **dataclasses.asdict(settings), guide=guide)
            samples, _ = jax.device_get(draw(params, rng, guide_params=guide_params))
            captions = None
            if self.class_prompts is not None:
                captions = tuple(p for p in self.class_prompts for _ in range(per_class))
            return self._artifact(samples, captions, per_class)
        conditions, captions = self._explicit_conditions(classes, prompts)
        lo, hi = settings.guidance_interval or (0.0, float("inf"))
        cfg = CFG(weight=guidance, sigma_lo=lo, sigma_hi=hi) if guidance != 1.0 else None
        draw = self._jitted_once(
            ("generate", steps, solver, cfg, id(guide)),
            self.generate,
            steps=steps,
            solver=solver,
            guidance=cfg,
            guide=guide,
        )
        samples = jax.device_get(draw(params, rng, conditions, guide_params=guide_params))
        return self._artifact(samples, captions, min(len(samples), 10))

    def _jitted_once(self, key: tuple, fn: Callable[..., Any], **static: Any) -> Callable[..., Any]:
        """``jax.jit(partial(fn, **static))``, built once per ``key`` (the static settings)."""
        if key not in self._jitted:
            self._jitted[key] = jax.jit(functools.partial(fn, **static))
        return self._jitted[key]

    def _explicit_conditions(self, classes, prompts) -> tuple[dict[str, jax.Array], tuple[str, ...] | None]:
        if classes is not None and prompts is not None:
            raise ValueError("give classes or prompts, not both")
        condition = self.input_spec.conditions.get("label")
        if prompts is not None:
            prompts = (prompts,) if isinstance(prompts, str) else tuple(prompts)
            if condition is None or condition.encoder != "byte_text":
                raise ValueError(f"prompts={prompts!r}: this model is not text-conditioned; give classes")
            if not prompts or not all(isinstance(p, str) for p in prompts):
                raise ValueError(f"prompts must be a non-empty sequence of str, got {prompts!r}")
            tokens = np.stack(
                [registry.encoders["byte_text"].tokens(p, condition.field.shape) for p in prompts]
            )
            return {"label": jnp.asarray(tokens)}, prompts
        classes = (classes,) if isinstance(classes, int) else tuple(classes)
        if not self.num_classes or not classes:
            raise ValueError(f"classes={classes!r}: this model has no classes")
        bad = [c for c in classes if not (isinstance(c, int | np.integer) and 0 <= c < self.num_classes)]
        if bad:
            raise ValueError(f"classes {bad} are out of range: expected ints in [0, {self.num_classes})")
        if self.class_prompts is not None:  # a text model asked for classes: each class's prompt
            return self._explicit_conditions(None, tuple(self.class_prompts[c] for c in classes))
        return {"label": jnp.asarray(classes, jnp.int32)}, None

    def score(self, preview: Any, metrics: Mapping[str, Callable[..., float]]) -> dict[str, float]:
        """``metric(images, labels)`` for each named metric on an image preview, the labels being
        the classes the rows were asked for; when the last preview held non-finite samples, no
        metric is asked (classifiers refuse NaN) and ``nonfinite_samples`` is reported instead."""
        if not metrics:
            return {}
        if not self.input_spec.sample.shape or len(self.input_spec.sample.shape) != 3:
            raise ConfigError(
                f"config.preview.metrics={tuple(metrics)!r} is invalid: previews of "
                f"{self.input_spec.sample.shape}-shaped samples are not images; expected ()"
            )
        if preview is None:
            return {}
        if self.nonfinite_samples:
            if jax.process_index() == 0:
                print(
                    f"preview: {self.nonfinite_samples} of {len(preview.images)} samples are non-finite; "
                    f"{', '.join(metrics)} not scored",
                    flush=True,
                )
            return {"nonfinite_samples": float(self.nonfinite_samples)}
        labels = np.repeat(np.arange(self.num_classes or 1), self.sampling.per_class)
        return {name: float(metric(preview.images, labels)) for name, metric in metrics.items()}


registry.objectives.register("diffusion", Diffusion)
