"""The ``iddpm`` objective: DiT's training (Peebles & Xie 2023; facebookresearch/DiT ``train.py``)
on the improved-DDPM process ``dew.diffusion.iddpm.GaussianDiffusion``.

Each step draws t ~ U{0, …, T−1} (``torch.randint(0, diffusion.num_timesteps, (B,))``) and
ε ~ N(0, I), forms x_t = √ᾱ_t x_0 + √(1 − ᾱ_t) ε and minimises the batch mean of
``GaussianDiffusion.training_losses``: with the default learned-range variance the hybrid
L = ‖ε − ε_θ(x_t, t, y)‖² (mean over elements) + L_vlb (bits per dimension, the mean half's
gradient stopped), as ``loss_dict["loss"].mean()``. The network is a registered model
(``config.model.name``, e.g. ``DiT-XL/2``) called as DiT's ``model(x, t, y)`` with t the integer
step (as float32) and y the int labels; class dropout (CFG's null class) is the network's label
embedder's, which draws from the step's key while training.

Sampling (previews, ``dew.pipeline``, ``python -m dew.sample``, ``python -m dew.fid``) is DiT's
``sample.py``: the process respaced to ``steps`` (``timestep_respacing=str(steps)``), the
ancestral DDPM loop (``p_sample_loop``, ``clip_denoised=False``) from z ~ N(0, I) over the batch
doubled with the null class, through the network's ``forward_with_cfg`` at ``cfg_scale``
(guidance on the first ``cfg_channels`` channels, 3 as DiT's), the conditional half kept. A
scale of 1 calls the network once, conditionally. ``config.objective.latent`` trains and samples
in a VAE's latent space (``dew.objectives.latent_space``) as the reference trains on SD-VAE
latents.
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
from dew.diffusion.iddpm import SCHEDULES, GaussianDiffusion
from dew.inputs import Condition, Field, InputSpec
from dew.objectives import latent_space
from dew.objectives.diffusion_preview import jitted_once
from dew.objectives.diffusion_sampling import requested_classes
from dew.objectives.model_inputs import sample_field, takes_arguments
from dew.objectives.whole import BuiltWhole
from dew.sampling.interface import DDPMLoop
from dew.schema import ConfigError, Key, Section, at_least

ModuleFactory = Callable[[], Any]  # a registered network's constructor (a haiku module)


@dataclasses.dataclass(frozen=True)
class Process:
    """DiT's ``create_diffusion`` arguments for training (``timestep_respacing=""``)."""

    noise_schedule: str = "linear"
    diffusion_steps: int = 1000
    learn_sigma: bool = True
    sigma_small: bool = False
    predict_xstart: bool = False
    use_kl: bool = False
    rescale_learned_sigmas: bool = False

    def diffusion(self, respacing: str = "") -> GaussianDiffusion:
        return GaussianDiffusion.create(respacing, **dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class IDDPMSampling:
    """How previews and inference sample: ``steps`` kept steps of the respaced process, the
    guidance scale and channels, ``method`` (``ddpm``: DiT's; ``ddim``: η = 0) and the samples
    per class."""

    steps: int = 250
    cfg_scale: float = 4.0
    cfg_channels: int = 3
    method: str = "ddpm"
    per_class: int = 8

    def __post_init__(self) -> None:
        checks = (
            ("steps", isinstance(self.steps, int) and self.steps >= 1, "an int >= 1"),
            ("cfg_scale", isinstance(self.cfg_scale, int | float) and self.cfg_scale >= 1, "a float >= 1"),
            ("cfg_channels", isinstance(self.cfg_channels, int) and self.cfg_channels >= 1, "an int >= 1"),
            ("method", self.method in ("ddpm", "ddim"), "'ddpm' or 'ddim'"),
            ("per_class", isinstance(self.per_class, int) and self.per_class >= 1, "an int >= 1"),
        )
        for name, ok, accepted in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected {accepted}")


class IDDPM(Objective, metaclass=BuiltWhole):
    """DiT's IDDPM training and guided ancestral sampling (module docstring); built whole here.

    ``num_classes`` is the label count (None: unconditional, the network gets label 0 and
    sampling is unguided). ``latent``/``image_shape``: the VAE space samples are decoded from.
    ``compute_dtype`` (``config.precision.compute``): the network computes in it on float32
    parameters, while t, the process's arithmetic and the loss stay float32
    (``dew.contracts.precision.compute_in``).
    """

    precisions = ("float32", "bfloat16")

    def __init__(
        self,
        input_spec: InputSpec,
        model: ModuleFactory,
        num_classes: int | None,
        *,
        process: Process = Process(),
        sampling: IDDPMSampling = IDDPMSampling(),
        latent: latent_space.LatentSpace | None = None,
        image_shape: tuple[int, ...] | None = None,
        compute_dtype: str = "float32",
    ):
        if num_classes is not None and "label" not in input_spec.conditions:
            raise ValueError("IDDPM: num_classes is set but the input spec has no 'label' condition")
        self.input_spec = input_spec
        self.num_classes = num_classes
        self.process, self.sampling = process, sampling
        self.diffusion = process.diffusion()
        self.latent, self.image_shape = latent, image_shape

        def forward(x, t, y, is_training: bool, cfg_scale=None, cfg_channels: int = 3):
            net = model()
            if cfg_scale is None:
                return net(x, t, y, is_training=is_training)
            return net.forward_with_cfg(x, t, y, cfg_scale, cfg_channels=cfg_channels)

        self._net = hk.transform(forward)
        self.compute_dtype = jnp.dtype(compute_dtype)
        self._apply = compute_in(self._net.apply, self.compute_dtype)  # the precision policy
        self._jitted: dict[tuple, Callable[..., Any]] = {}
        self._last_preview = {"nonfinite": 0}

    # --- pure pieces ------------------------------------------------------------------------------
    def _labels(self, batch: Batch, n: int) -> jax.Array:
        if self.num_classes is None:
            return jnp.zeros((n,), jnp.int32)
        return batch[self.input_spec.conditions["label"].field.name]

    def training_sample(self, batch: Batch, rng: jax.Array) -> jax.Array:
        x = batch[self.input_spec.sample.name]
        return x if self.latent is None else self.latent.draw(x, rng)

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        x = batch[self.input_spec.sample.name]
        x = x if self.latent is None else self.latent.mean(x)
        return self._net.init(rng, x, jnp.zeros(x.shape[:1]), self._labels(batch, x.shape[0]), False)

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        t_rng, noise_rng, net_rng = jax.random.split(rng, 3)
        x = self.training_sample(batch, rng)
        y = self._labels(batch, x.shape[0])
        t = self.diffusion.sample_timesteps(t_rng, x.shape[0])
        noise = jax.random.normal(noise_rng, x.shape, x.dtype)

        def model(x_t: jax.Array, steps: jax.Array) -> jax.Array:
            return self._apply(params, net_rng, x_t, steps, y, step.is_training)

        terms = self.diffusion.training_losses(model, x, t, noise)
        stats = {k: jnp.mean(v) for k, v in terms.items() if k != "loss"}
        return jnp.mean(terms["loss"]), (stats, Aux())

    # --- sampling ---------------------------------------------------------------------------------
    def generate(
        self,
        params: Params,
        rng: jax.Array,
        labels: jax.Array | None = None,
        *,
        steps: int = 250,
        cfg_scale: float = 1.0,
        cfg_channels: int = 3,
        method: str = "ddpm",
        num_samples: int | None = None,
    ) -> jax.Array:
        """Samples for ``labels`` [n] (or ``num_samples`` unconditional ones) through the process
        respaced to ``steps`` (DiT's ``sample.py``: z, then the batch doubled with the null class
        when ``cfg_scale`` != 1, ``forward_with_cfg``, the first half kept). Pure, jittable."""
        diffusion = self.process.diffusion(str(steps))
        n = labels.shape[0] if labels is not None else (num_samples or 1)
        y = labels if labels is not None else jnp.zeros((n,), jnp.int32)
        noise_rng, step_rng = jax.random.split(rng)
        z = jax.random.normal(noise_rng, (n, *self.input_spec.sample.shape), jnp.float32)
        model, guided = self.sampling_model(params, y, cfg_scale, cfg_channels)
        if guided:
            z = jnp.concatenate([z, z], axis=0)
        out = DDPMLoop(method=method, clip_denoised=False)(model, z, diffusion, step_rng)
        return out[:n]

    def sampling_model(
        self, params: Params, labels: jax.Array, cfg_scale: float, cfg_channels: int = 3
    ) -> tuple[Callable[[jax.Array, jax.Array], jax.Array], bool]:
        """(model(x, t), guided): the network for ``labels`` as the sampling loop calls it. When
        guided (classes and ``cfg_scale`` != 1) it is ``forward_with_cfg`` on the doubled batch
        [x; x] with y = [labels; null class], as DiT's ``sample.py`` passes it to
        ``p_sample_loop``; the caller doubles the noise and keeps the first half."""
        guided = self.num_classes is not None and cfg_scale != 1.0
        if not guided:
            return (lambda x, t: self._apply(params, None, x, t, labels, False)), False
        assert self.num_classes is not None  # guided implies classes
        y = jnp.concatenate([labels, jnp.full(labels.shape, self.num_classes, jnp.int32)], axis=0)
        return (lambda x, t: self._apply(params, None, x, t, y, False, cfg_scale, cfg_channels)), True

    def draw(self, params: Params, rng: jax.Array, *, per_class: int, **settings: Any) -> jax.Array:
        """``per_class`` samples of every class, class-major (unconditional: ``per_class``)."""
        labels = None
        if self.num_classes:
            labels = jnp.repeat(jnp.arange(self.num_classes, dtype=jnp.int32), per_class)
        return self.generate(params, rng, labels, num_samples=per_class, **settings)

    def _grid(self, samples: np.ndarray, columns: int) -> ImageGrid:
        finite = np.isfinite(samples.reshape(len(samples), -1)).all(axis=1)
        self._last_preview["nonfinite"] = int(np.sum(~finite))
        samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
        if self.latent is not None:
            samples = self.latent.to_images(samples)
        return ImageGrid(np.clip(samples, -1.0, 1.0), columns=columns)

    def _draw_grid(self, params: Params, rng: jax.Array, settings: dict[str, Any]) -> ImageGrid:
        draw = jitted_once(self._jitted, tuple(sorted(settings.items())), self.draw, **settings)
        return self._grid(np.asarray(jax.device_get(draw(params, rng))), settings["per_class"])

    # --- what a person sees -----------------------------------------------------------------------
    def preview(self, params: Params, rng: jax.Array) -> ImageGrid:
        """``per_class`` samples of every class (one row each) at the configured settings."""
        shape = self.image_shape or self.input_spec.sample.shape
        if len(shape) != 3 or shape[-1] not in (1, 3):
            raise NotImplementedError(f"IDDPM.preview draws images [H, W, 1|3], not {shape}")
        return self._draw_grid(params, rng, dataclasses.asdict(self.sampling))

    def score(self, preview: Any, metrics: Mapping[str, Callable[..., float]]) -> dict[str, float]:
        """Each metric(images, labels) on an image preview; a preview with non-finite samples
        reports ``nonfinite_samples`` instead."""
        if not metrics or preview is None:
            return {}
        if self._last_preview["nonfinite"]:
            return {"nonfinite_samples": float(self._last_preview["nonfinite"])}
        labels = np.repeat(np.arange(self.num_classes or 1), self.sampling.per_class)
        return {name: float(metric(preview.images, labels)) for name, metric in metrics.items()}

    # --- inference (dew.pipeline) -------------------------------------------------------------
    def inference_options(self) -> dict[str, Any]:
        """What ``dew.pipeline`` accepts; the defaults are the run's preview settings."""
        return {"classes": None, **dataclasses.asdict(self.sampling), "seed": 0}

    def infer(self, params: Params, *, classes, seed: int, **settings: Any) -> ImageGrid:
        """Without ``classes``: ``per_class`` of every class exactly as ``preview`` draws them
        (``seed`` = the run's seed reproduces its previews); with ``classes``: one per entry."""
        settings = dataclasses.asdict(IDDPMSampling(**settings))  # checked
        rng = jax.random.PRNGKey(seed)
        if classes is None:
            return self._draw_grid(params, rng, settings)
        classes = requested_classes(classes, self.num_classes)
        settings.pop("per_class")
        generate = jitted_once(
            self._jitted, ("classes", *sorted(settings.items())), self.generate, **settings
        )
        samples = jax.device_get(generate(params, rng, jnp.asarray(classes, jnp.int32)))
        return self._grid(np.asarray(samples), min(len(samples), 10))

    # --- config ---------------------------------------------------------------------------------
    @classmethod
    def config_section(cls) -> Section:
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> IDDPM:
        o = config.objective
        name = config.model.name
        if name is None:
            raise ConfigError(
                "config.model.name=None is invalid: the iddpm objective needs a network called as "
                f"net(x, t, y) with forward_with_cfg (e.g. DiT-XL/2), one of {registry.models.names()}"
            )
        component = registry.models[name]
        if not takes_arguments(component, ("y",)):
            raise ConfigError(
                f"config.model.name={name!r} is invalid: the iddpm objective calls its network as "
                "net(x, t, y) (DiT's forward); expected a DiT (e.g. DiT-XL/2)"
            )
        options = {k: v for k, v in config.model.items() if k != "name"}
        choice = o.condition
        if choice == "auto":
            choice = "class_label" if source.num_classes else "none"
        if choice == "class_label" and not source.num_classes:
            raise ConfigError(f"config.objective.condition='class_label': {source.name} has no classes")
        conditions = {}
        if choice == "class_label":
            conditions["label"] = Condition("class_label", Field("label", (), "int32"), source.num_classes)
        field, latent, image_shape = sample_field(config, source)
        process = Process(
            o.noise_schedule,
            o.diffusion_steps,
            o.learn_sigma,
            o.sigma_small,
            o.predict_xstart,
            o.use_kl,
            o.rescale_learned_sigmas,
        )
        return cls(
            InputSpec(field, conditions),
            functools.partial(component, **options),
            int(source.num_classes) if conditions else None,
            process=process,
            sampling=IDDPMSampling(**o.sampling.to_dict()),
            latent=latent,
            image_shape=image_shape,
            compute_dtype=compute_dtype_of(config),
        )


def _validate(section: Any, path: str) -> None:
    del path
    try:
        IDDPMSampling(**section.sampling.to_dict())
    except ValueError as e:
        raise ConfigError(f"config.objective.sampling.{e}") from None


CONFIG = Section(
    "DiT's improved-DDPM training (learned-range variance, hybrid MSE + VLB) and guided DDPM sampling",
    {
        "noise_schedule": Key("linear", "β schedule: linear or squaredcos_cap_v2", choices=SCHEDULES),
        "diffusion_steps": Key(1000, "T, the training process's steps", **at_least(2, "an int >= 2")),
        "learn_sigma": Key(True, "the network's second half of channels interpolates log σ² (hybrid loss)"),
        "sigma_small": Key(False, "fixed variance β̃_t rather than β_t (learn_sigma=False)"),
        "predict_xstart": Key(False, "the network predicts x_0 rather than ε"),
        "use_kl": Key(False, "train on the VLB alone (rescaled KL)"),
        "rescale_learned_sigmas": Key(False, "scale the VLB term by T/1000 (RESCALED_MSE)"),
        "condition": Key(
            "auto",
            "class_label, none, or auto (class labels when the data has classes)",
            choices=("auto", "class_label", "none"),
        ),
        "latent": latent_space.CONFIG,
        "sampling": Section(
            "how previews and inference sample (DiT's sample.py)",
            {
                "steps": Key(250, "the respaced process's steps", **at_least(1, "an int >= 1")),
                "cfg_scale": Key(
                    4.0, "classifier-free guidance scale (1: none)", **at_least(1, "a float >= 1")
                ),
                "cfg_channels": Key(3, "channels guidance applies to (DiT: the first 3)"),
                "method": Key("ddpm", "ddpm (ancestral, DiT's) or ddim (η = 0)", choices=("ddpm", "ddim")),
                "per_class": Key(8, "samples per class (one grid row each)", **at_least(1, "an int >= 1")),
            },
        ),
    },
    validate=_validate,
)

registry.objectives.register("iddpm", IDDPM)
