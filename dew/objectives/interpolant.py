"""Training with SiT's transport loss (Ma et al. 2024; willisma/SiT ``train.py``): the
``interpolant`` objective.

Each step draws t ~ U(t0, t1) over the training interval and x0 ~ N(0, I), forms
x_t = α_t x1 + σ_t x0 on the configured path and regresses the network's output at (x_t, t) onto
the prediction's target with its weighting (``dew.diffusion.transport.Transport.training_losses``);
the loss is the batch mean of the per-example losses, as SiT's ``loss_dict["loss"].mean()``.

The network is a registered model (``config.model.name``) called as ``net(x, t, y)`` with t
continuous in [0, 1], [B], and y the raw integer class labels (or ``net(x, t)`` without classes),
as SiT's and DiT's ``forward(x, t, y)``; class dropout for classifier-free guidance, as in SiT,
belongs to the network's label embedder, which gets the step's rng while training (haiku's
``next_rng_key``) and no rng when sampling.

With ``config.objective.repa.encoder`` set, the step adds REPA's representation alignment
(``dew.objectives.repa``): the network is built with REPA's projector after block
``encoder_depth`` and called with ``return_features=True``; the loss is the batch mean of the
transport loss plus ``proj_coeff`` times the negative cosine similarity of the projected tokens to
a frozen encoder's patch tokens of the same batch (``Repa``; its weights are constants of the
step, not parameters).

The objective is built whole by its constructor (no attribute set afterwards): the transport, the
network factory, the input spec, the preview's sampler and the REPA settings are its arguments.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.artifacts import ImageGrid
from dew.contracts.objective import Aux, Batch, Objective, Params, Stats, Step
from dew.contracts.precision import compute_dtype_of, compute_in
from dew.diffusion.transport import Transport
from dew.inputs import Condition, Field, InputSpec
from dew.objectives import latent_space, scatter
from dew.objectives.diffusion_preview import jitted_once
from dew.objectives.diffusion_sampling import requested_classes
from dew.objectives.diffusion_scoring import preview_scores
from dew.objectives.interpolant_config import (
    CONFIG,
    Guidance,
    Preview,
    TransportSampler,
    transport_sampler,
)
from dew.objectives.model_inputs import sample_field, takes_arguments
from dew.objectives.repa import Repa, total_loss
from dew.objectives.repa_config import repa_from_config
from dew.objectives.whole import BuiltWhole
from dew.schema import ConfigError, Section

ModuleFactory = Callable[[], Any]  # a registered network's constructor (a haiku module)
DEFAULT_PREVIEW = Preview()  # the preview an Interpolant built without one draws


class Interpolant(Objective, metaclass=BuiltWhole):
    """The transport loss of one ``Transport`` for a network F(x, t[, y]).

    ``num_classes`` is the label count of a class-conditional network (None: unconditional).
    ``extent`` is the half-width of a 2-D point preview's picture (None: the samples' own).
    ``learn_sigma``: the network returns twice the sample's channels (last axis), as DiT and SiT
    networks built with ``learn_sigma=True`` do; the transport uses the first half, as SiT's
    ``forward`` does (``x, _ = x.chunk(2, dim=1)``). ``latent``/``image_shape``: the VAE space
    the samples live in (``config.objective.latent``, ``dew.objectives.latent_space``: raw
    latents in the data, final latents drawn per step, samples decoded for previews and
    inference), as SiT trains on SD-VAE latents.
    ``repa``: REPA's alignment (``dew.objectives.repa.Repa``); the network factory is then called
    with ``repa.network_options()`` and must return ``(out, features)`` for ``return_features=True``
    (the DiT / SiT networks do).
    ``compute_dtype`` (``config.precision.compute``): the network computes in it on float32
    parameters; t, the path and the loss stay float32 (``dew.contracts.precision.compute_in``);
    REPA's frozen encoder computes in it too, its tokens returned as float32.
    """

    precisions = ("float32", "bfloat16")

    def __init__(
        self,
        input_spec: InputSpec,
        transport: Transport,
        model: ModuleFactory,
        num_classes: int | None = None,
        preview: Preview = DEFAULT_PREVIEW,
        extent: float | None = None,
        learn_sigma: bool = False,
        latent: latent_space.LatentSpace | None = None,
        image_shape: tuple[int, ...] | None = None,
        repa: Repa | None = None,
        compute_dtype: str = "float32",
    ):
        if num_classes is not None and "label" not in input_spec.conditions:
            raise ValueError("Interpolant: num_classes is set but the input spec has no 'label' condition")
        self.input_spec = input_spec
        self.transport = transport
        self.num_classes = num_classes
        self.preview_settings = preview
        self.extent = extent
        self.repa = repa
        self.sampler = dataclasses.replace(transport_sampler(preview.sampler), num_steps=preview.steps)
        self.guidance = Guidance.of(preview)
        self.latent, self.image_shape = latent, image_shape
        conditional = num_classes is not None
        # DiT/SiT networks drop labels (CFG's null class) only when told they are training
        dropout = takes_arguments(model, ("is_training",))
        build = model if repa is None else functools.partial(model, **repa.network_options())

        def forward(
            x: jax.Array, t: jax.Array, y: jax.Array | None, features: bool = False, training: bool = False
        ):
            net = build()
            kwargs: dict[str, bool] = {"return_features": True} if features else {}
            if dropout:
                kwargs["is_training"] = training  # the label embedder's class dropout (DiT / SiT)
            out = net(x, t, y, **kwargs) if conditional else net(x, t, **kwargs)
            projected = None
            if features:
                out, projected = out
            if learn_sigma:
                if out.shape[-1] != 2 * x.shape[-1]:
                    raise ValueError(
                        f"Interpolant: learn_sigma=True but the network returned {out.shape[-1]} channels "
                        f"for {x.shape[-1]}; expected {2 * x.shape[-1]}"
                    )
                out = out[..., : x.shape[-1]]
            return (out, projected) if features else out

        self._net = hk.transform(forward)
        self._guided = hk.transform(functools.partial(_guided_forward, model, learn_sigma))
        # the precision policy: the network (and REPA's projector) in compute_dtype, the rest float32
        self.compute_dtype = jnp.dtype(compute_dtype)
        self._apply = compute_in(self._net.apply, self.compute_dtype)
        self._apply_guided = compute_in(self._guided.apply, self.compute_dtype)
        self._jitted: dict[tuple, Callable[..., Any]] = {}

    # --- pure pieces ------------------------------------------------------------------------------
    def _labels(self, batch: Batch) -> jax.Array | None:
        if self.num_classes is None:
            return None
        return batch[self.input_spec.conditions["label"].field.name]

    def network(self, params: Params, labels: jax.Array | None, rng: jax.Array | None = None):
        """model(x, t): the network for fixed labels (``rng``: its dropout key while training; a
        network whose call takes ``is_training`` is then called with ``is_training=True``).
        ``guide_time`` (a guided network's interval decision, ``guided_network``) is ignored."""

        def model(x: jax.Array, t: jax.Array, guide_time: jax.Array | None = None) -> jax.Array:
            del guide_time
            return self._apply(params, rng, x, t, labels, False, rng is not None)

        return model

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        x = batch[self.input_spec.sample.name]
        x = x if self.latent is None else self.latent.mean(x)
        return self._net.init(rng, x, jnp.zeros(x.shape[:1], x.dtype), self._labels(batch))

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        x1 = batch[self.input_spec.sample.name]
        x1 = x1 if self.latent is None else self.latent.draw(x1, rng)
        t_rng, noise_rng, net_rng = jax.random.split(rng, 3)
        t = self.transport.sample_t(t_rng, x1.shape[0])
        x0 = jax.random.normal(noise_rng, x1.shape, x1.dtype)
        labels, key = self._labels(batch), net_rng if step.is_training else None
        if self.repa is None:
            terms = self.transport.training_losses(self.network(params, labels, key), x1, t, x0)
            return jnp.mean(terms["loss"]), ({}, Aux())
        zs = (self.repa.targets(batch[self.repa.image_field], self.compute_dtype),)

        def network(x: jax.Array, tt: jax.Array):
            return self._apply(params, key, x, tt, labels, True, key is not None)

        loss, stats = total_loss(self.transport, network, x1, t, x0, zs, self.repa.proj_coeff)
        return loss, (stats, Aux())

    def guided_network(self, params: Params, labels: jax.Array, guidance: Guidance):
        """model(x, t[, guide_time]) on the doubled batch [x; x] with y = [labels; null]:
        ``forward_with_cfg`` for t (or ``guide_time``, when the sampler gives one: REPA's Heun
        corrector) inside the guidance interval, the plain network (conditional first half)
        outside."""
        assert self.num_classes is not None, "guidance needs classes (checked by generate)"
        y = jnp.concatenate([labels, jnp.full(labels.shape, self.num_classes, labels.dtype)])
        lo, hi = guidance.interval

        def model(x: jax.Array, t: jax.Array, guide_time: jax.Array | None = None) -> jax.Array:
            def guided() -> jax.Array:
                return self._apply_guided(params, None, x, t, y, guidance.cfg_scale, guidance.cfg_channels)

            if (lo, hi) == (0.0, 1.0):
                return guided()
            now = jnp.reshape(t if guide_time is None else guide_time, (-1,))[0]
            inside = (now >= lo) & (now <= hi)
            return jax.lax.cond(inside, guided, lambda: self._apply(params, None, x, t, y))

        return model

    def generate(
        self,
        params: Params,
        rng: jax.Array,
        labels: jax.Array | None = None,
        num: int | None = None,
        sampler: TransportSampler | None = None,
        guidance: Guidance | None = None,
    ) -> jax.Array:
        """Samples from noise drawn with ``rng``: one per label (or ``num`` without classes),
        through ``sampler`` (default: the preview's) with ``guidance`` (default: the preview's;
        class-conditional only): SiT's ``sample.py``, z ~ N(0, I) doubled with the null class
        and the first half of the result kept."""
        sampler = sampler or self.sampler
        guidance = guidance or self.guidance
        count = labels.shape[0] if labels is not None else num
        if count is None:
            raise ValueError("generate: give labels (class-conditional) or num (unconditional)")
        noise_rng, step_rng = jax.random.split(rng)
        z = jax.random.normal(noise_rng, (count, *self.input_spec.sample.shape))
        if labels is None or guidance.cfg_scale == 1.0:
            return sampler.sample(self.transport, self.network(params, labels), z, step_rng)
        model = self.guided_network(params, labels, guidance)
        return sampler.sample(self.transport, model, jnp.concatenate([z, z]), step_rng)[:count]

    # --- what a person sees -----------------------------------------------------------------------
    def preview(self, params: Params, rng: jax.Array) -> ImageGrid:
        """``per_class`` samples of each class (one row each), or ``per_class`` in all; 2-D
        points as one scatter picture (``dew.objectives.scatter``)."""
        shape = self.input_spec.sample.shape
        per = self.preview_settings.per_class
        if shape == (2,):
            labels = None if self.num_classes is None else jnp.arange(per, dtype=jnp.int32) % self.num_classes
            generate = jitted_once(self._jitted, ("points", per), self.generate, num=per)
            points = np.asarray(generate(params, rng, labels))
            return scatter.scatter_grid(points, self.extent or scatter.extent_of(points))
        if len(self.image_shape or shape) != 3 or (self.image_shape or shape)[-1] not in (1, 3):
            raise NotImplementedError(
                f"Interpolant.preview draws images [H, W, 1|3] or 2-D points, not {shape}"
            )
        return self._draw_grid(params, rng, self.preview_settings)

    def score(self, preview: Any, metrics: Mapping[str, Callable[..., float]]) -> dict[str, float]:
        """Each metric(images, labels) on an image preview (``diffusion_scoring.preview_scores``:
        ``per_class`` rows per class, class-major); a preview holding non-finite samples reports
        ``nonfinite_samples`` instead; 2-D point previews take no metric."""
        nonfinite = 0
        if preview is not None:
            rows = np.asarray(preview.images).reshape(len(preview.images), -1)
            nonfinite = int(np.sum(~np.isfinite(rows).all(axis=1)))
        return preview_scores(
            preview,
            metrics,
            sample_shape=tuple(self.image_shape or self.input_spec.sample.shape),
            num_classes=self.num_classes,
            per_class=self.preview_settings.per_class,
            nonfinite=nonfinite,
        )

    def _draw_grid(self, params: Params, rng: jax.Array, settings: Preview) -> ImageGrid:
        """``settings.per_class`` images of every class (or in all), as ``preview`` draws them."""
        per = settings.per_class
        sampler = dataclasses.replace(transport_sampler(settings.sampler), num_steps=settings.steps)
        num = per if self.num_classes is None else None
        generate = jitted_once(
            self._jitted,
            dataclasses.astuple(settings),
            self.generate,
            num=num,
            sampler=sampler,
            guidance=Guidance.of(settings),
        )
        labels = None
        if self.num_classes is not None:
            labels = jnp.repeat(jnp.arange(self.num_classes, dtype=jnp.int32), per)
        return self._grid(generate(params, rng, labels), per)

    def _grid(self, samples: jax.Array, columns: int) -> ImageGrid:
        """Samples as images in [−1, 1] (decoded by the VAE for latent samples)."""
        images = np.asarray(jax.device_get(samples), np.float32)
        if self.latent is not None:
            images = self.latent.to_images(images)
        return ImageGrid(np.clip(images, -1.0, 1.0), columns=columns)

    # --- inference (dew.pipeline) -------------------------------------------------------------
    def inference_options(self) -> dict[str, Any]:
        """What ``dew.pipeline`` accepts; the defaults are the run's preview settings."""
        return {"classes": None, **dataclasses.asdict(self.preview_settings), "seed": 0}

    def infer(self, params: Params, *, classes, seed: int, **settings: Any) -> ImageGrid:
        """Images [H, W, 1|3]: without ``classes``, ``per_class`` of every class exactly as
        ``preview`` draws them (``seed`` = the run's seed reproduces its previews); with
        ``classes``, one per entry (in one row)."""
        settings["guidance_interval"] = tuple(settings["guidance_interval"])
        preview = Preview(**settings)
        Guidance.of(preview)  # checked: one line naming the option
        transport_sampler(preview.sampler)
        shape = self.image_shape or self.input_spec.sample.shape
        if len(shape) != 3 or shape[-1] not in (1, 3):
            raise ValueError(f"infer draws images [H, W, 1|3], not {shape}")
        rng = jax.random.PRNGKey(seed)
        if classes is None:
            return self._draw_grid(params, rng, preview)
        classes = requested_classes(classes, self.num_classes)
        sampler = dataclasses.replace(transport_sampler(preview.sampler), num_steps=preview.steps)
        guidance = Guidance.of(preview)
        key = ("classes", preview.sampler, preview.steps, guidance)
        generate = jitted_once(self._jitted, key, self.generate, sampler=sampler, guidance=guidance)
        images = generate(params, rng, jnp.asarray(classes, jnp.int32))
        return self._grid(images, min(len(classes), 10))

    # --- config ---------------------------------------------------------------------------------------
    @classmethod
    def config_section(cls) -> Section:
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> Interpolant:
        """Build from ``config.objective`` and ``config.model`` for ``source``: the transport from
        ``path``/``prediction``/``loss_weight``/``train_eps``/``sample_eps`` (SiT's
        ``create_transport``), class labels when ``condition`` is ``class_label`` (or ``auto`` and
        the source has classes)."""
        o = config.objective
        if config.model.name is None:
            raise ConfigError(
                "config.model.name=None is invalid: the interpolant objective needs a network, one of "
                f"{registry.models.names()}"
            )
        transport = Transport.create(o.path, o.prediction, o.loss_weight, o.train_eps, o.sample_eps)
        column = source.fields[source.sample_field]
        sample, latent, image_shape = sample_field(config, source)
        choice = o.condition
        if choice == "auto":
            choice = "class_label" if source.num_classes else "none"
        if choice == "class_label" and not source.num_classes:
            raise ConfigError(f"config.objective.condition='class_label': {source.name} has no classes")
        conditions = {}
        if choice == "class_label":
            conditions["label"] = Condition("class_label", Field("label", (), "int32"), source.num_classes)
        model_cfg = {k: v for k, v in config.model.items() if k != "name"}
        model = functools.partial(registry.models[config.model.name], **model_cfg)
        repa = None
        if o.repa.encoder is not None:
            repa = repa_from_config(o.repa, model, source, sample, config.model.name)
            if repa.image_field != sample.name:
                shape = tuple(source.fields[repa.image_field].shape[1:])
                field = Field(repa.image_field, shape, str(source.fields[repa.image_field].dtype))
                conditions["repa"] = Condition(o.repa.encoder, field)
        return cls(
            InputSpec(sample, conditions),
            transport,
            model,
            source.num_classes if conditions else None,
            Preview(**o.sampling.to_dict()),
            scatter.extent_of(np.asarray(column[: min(len(column), 4096)])) if sample.shape == (2,) else None,
            o.learn_sigma,
            latent,
            image_shape,
            repa,
            compute_dtype_of(config),
        )


def _guided_forward(
    model: ModuleFactory, learn_sigma: bool, x: jax.Array, t: jax.Array, y: jax.Array, scale, channels: int
) -> jax.Array:
    """The network's ``forward_with_cfg`` (its variance half dropped as SiT's forward does)."""
    out = model().forward_with_cfg(x, t, y, scale, cfg_channels=channels)
    return out[..., : x.shape[-1]] if learn_sigma else out


registry.objectives.register("interpolant", Interpolant)
