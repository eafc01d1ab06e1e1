"""The ``meanflow`` objective: one- and few-step generation by average velocity (Geng et al. 2025).

The network u_θ(z_t, t, h) predicts the average velocity over [r, t] with h = t − r (t and h [B]
in [0, 1], as the reference feeds its DiT), called in one of the two ways dew's networks take
classes (``label_input``, read from the network's signature by ``from_config``):

* ``"label"`` (dew's U-Nets): ``net(z, t, h=h, label=<class encoder's vector>, is_training=...)``,
  no ``label`` for unconditional data, the dropped class being the encoder's -1 (zeros);
* ``"y"`` (``dew.networks.dit``, built with ``time_inputs=("t", "h")``, ``class_dropout_prob=0``
  and ``null_class=True`` as MeanFlow builds its DiT): ``net(z, t, y, h=h, is_training=...)`` with
  int labels, the dropped class being ``num_classes`` (the label table's null row, as the
  reference's).

Training is
``dew.objectives.meanflow_loss.meanflow_loss`` (the JVP target, adaptive weighting, guidance
folded into training, class dropout) on draws made per step from the step's key; sampling is
``dew.sampling.meanflow.sample_mean_flow`` on a schedule of t points from 1 to 0, one network
evaluation per interval and no sampling-time guidance (it was trained in).

Previews, ``dew.pipeline``, ``python -m dew.sample`` and ``python -m dew.fid`` draw through the
same contract as the diffusion objective: ``preview`` (``per_class`` samples of every class),
``inference_options``/``infer`` (``classes``, ``per_class``, ``schedule``, ``seed``) and
``score`` (registered metrics on an image preview). ``config.objective.latent`` trains in a VAE's
latent space as the diffusion objective does (the references train on ImageNet latents).
"""

from __future__ import annotations

import dataclasses
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
from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import InputSpec
from dew.objectives import latent_space
from dew.objectives.diffusion_preview import jitted_once
from dew.objectives.diffusion_sampling import requested_classes
from dew.objectives.meanflow_config import CONFIG
from dew.objectives.meanflow_loss import (
    Guidance,
    TimeSampling,
    Weighting,
    draw_meanflow,
    meanflow_loss,
)
from dew.objectives.model_inputs import (
    ModuleFactory,
    check_label_input,
    class_conditions,
    label_input,
    network_factory,
    sample_field,
)
from dew.objectives.whole import BuiltWhole
from dew.sampling.interface import MeanFlowLoop
from dew.sampling.meanflow import check_schedule
from dew.schema import ConfigError, Section


@dataclasses.dataclass(frozen=True)
class MeanFlowSampling:
    """How previews and inference sample: the t points (1 … 0; (1, 0) is one step) and the
    samples per class."""

    schedule: tuple[float, ...] = (1.0, 0.0)
    per_class: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", check_schedule(self.schedule, "schedule"))
        if not (isinstance(self.per_class, int) and self.per_class >= 1):
            raise ValueError(f"per_class={self.per_class!r} is invalid: expected an int >= 1")


class MeanFlow(Objective, metaclass=BuiltWhole):
    """MeanFlow training and one-/few-step sampling (module docstring); built whole here.

    ``compute_dtype`` (``config.precision.compute``): the network, and so the JVP through it,
    computes in it on float32 parameters; the times, the target and the loss stay float32
    (``dew.contracts.precision.compute_in``), as the JAX references' bf16 runs do."""

    precisions = ("float32", "bfloat16")

    def __init__(
        self,
        input_spec: InputSpec,
        model: ModuleFactory,
        encoder: ModuleFactory | None,
        num_classes: int | None,
        *,
        times: TimeSampling | None = None,
        guidance: Guidance | None = None,
        weighting: Weighting | None = None,
        sampling: MeanFlowSampling | None = None,
        latent: latent_space.LatentSpace | None = None,
        image_shape: tuple[int, ...] | None = None,
        label_input: str = "label",
        compute_dtype: str = "float32",
    ):
        times, guidance = times or TimeSampling(), guidance or Guidance()
        check_label_input(label_input)
        weighting, sampling = weighting or Weighting(), sampling or MeanFlowSampling()
        if (encoder is None) != (num_classes is None):
            raise ValueError("MeanFlow: give a class encoder and num_classes together, or neither")
        if num_classes is None and guidance.uses_classes:
            raise ValueError(
                f"MeanFlow: guidance_eq={guidance.guidance_eq!r}, class_dropout_prob="
                f"{guidance.class_dropout_prob} need classes; expected guidance_eq='none' and "
                "class_dropout_prob=0 for an unconditional model"
            )
        self._hold(
            input_spec,
            model,
            encoder,
            num_classes,
            times=times,
            guidance=guidance,
            weighting=weighting,
            sampling=sampling,
            latent=latent,
            image_shape=image_shape,
            label_input=label_input,
            compute_dtype=compute_dtype,
        )

    def _hold(
        self,
        input_spec: InputSpec,
        model: ModuleFactory,
        encoder: ModuleFactory | None,
        num_classes: int | None,
        *,
        times: TimeSampling,
        guidance: Any,
        weighting: Weighting,
        sampling: Any,
        latent: latent_space.LatentSpace | None,
        image_shape: tuple[int, ...] | None,
        label_input: str,
        compute_dtype: str = "float32",
    ) -> None:
        """Every attribute, from the arguments a constructor checked and completed with its
        defaults: this one's and its siblings' (``IMeanFlow``, whose guidance and sampling
        settings are its own classes); the network is ``self._forward`` of the model."""
        self.input_spec = input_spec
        self.num_classes = num_classes
        self.times, self.guidance, self.weighting = times, guidance, weighting
        self.sampling = sampling
        self.latent, self.image_shape = latent, image_shape
        self.label_input = label_input
        # the label the network reads as "no class": the encoder's -1, or DiT's null row
        self.null_label = UNCONDITIONAL if label_input == "label" else int(num_classes or 0)
        self._net = hk.transform(self._forward(model, encoder, label_input))
        # the precision policy: the network and its JVP in compute_dtype, the targets float32
        self.compute_dtype = jnp.dtype(compute_dtype)
        self._apply = compute_in(self._net.apply, self.compute_dtype)
        self._jitted: dict[tuple, Callable[..., Any]] = {}  # jitted draws by their static settings
        self._last_preview = {"nonfinite": 0}

    # --- the network ----------------------------------------------------------------------------
    @staticmethod
    def _forward(model: ModuleFactory, encoder: ModuleFactory | None, label_input: str) -> Callable[..., Any]:
        def forward(x, t, h, labels, is_training):
            if label_input == "y":
                return model()(x, t, labels, h=h, is_training=is_training)
            kwargs = {} if encoder is None else {"label": encoder()(labels)}
            return model()(x, t, h=h, is_training=is_training, **kwargs)

        return forward

    def average_velocity(
        self, params: Params, rng: jax.Array | None, is_training: bool
    ) -> Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]:
        """u(z, t, h, y): the network with ``params`` (t, h [B]; y the int labels [B])."""

        def u(z, t, h, y):
            return self._apply(params, rng, z, t, h, y, is_training)

        return u

    def _labels(self, batch: Batch, n: int) -> jax.Array:
        return batch["label"] if self.num_classes else jnp.zeros((n,), jnp.int32)

    def training_sample(self, batch: Batch, rng: jax.Array) -> jax.Array:
        y = batch[self.input_spec.sample.name]
        return y if self.latent is None else self.latent.draw(y, rng)

    # --- the pure functions ---------------------------------------------------------------------
    def init(self, rng: jax.Array, batch: Batch) -> Params:
        y = batch[self.input_spec.sample.name]
        x = y if self.latent is None else self.latent.mean(y)
        t = jnp.zeros(x.shape[:1])
        return self._net.init(rng, x, t, t, self._labels(batch, x.shape[0]), True)

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        draw_rng, net_rng = jax.random.split(rng)
        x = self.training_sample(batch, rng)
        draws = draw_meanflow(draw_rng, x, self.times)
        u = self.average_velocity(params, net_rng, step.is_training)
        y = self._labels(batch, x.shape[0])
        guide = self.average_velocity(params, net_rng, False)  # the reference's train=False
        terms = meanflow_loss(
            u, x, y, draws, self.times, self.guidance, self.weighting, self.null_label, guide_fn=guide
        )
        stats = {"u_error": jnp.mean(terms.per_example), "v_loss": jnp.mean(terms.v_loss)}
        return terms.loss, (stats, Aux())

    # --- sampling ---------------------------------------------------------------------------------
    def generate(
        self,
        params: Params,
        rng: jax.Array,
        labels: jax.Array | None = None,
        *,
        schedule: tuple[float, ...] = (1.0, 0.0),
        num_samples: int | None = None,
    ) -> jax.Array:
        """Samples for ``labels`` [n] (or ``num_samples`` unconditional ones) along ``schedule``;
        the noise at t = 1 is drawn from ``rng``. Pure and jittable."""
        n = labels.shape[0] if labels is not None else (num_samples or 1)
        y = labels if labels is not None else jnp.zeros((n,), jnp.int32)
        noise = jax.random.normal(rng, (n, *self.input_spec.sample.shape), jnp.float32)
        u = self.average_velocity(params, None, False)
        return MeanFlowLoop()(lambda z, t, h: u(z, t, h, y), noise, schedule)

    def draw(self, params: Params, rng: jax.Array, *, per_class: int, **settings: Any) -> jax.Array:
        """``per_class`` samples of every class, class-major (unconditional: ``per_class``)."""
        labels = None
        if self.num_classes:
            labels = jnp.repeat(jnp.arange(self.num_classes, dtype=jnp.int32), per_class)
        return self.generate(params, rng, labels, num_samples=per_class, **settings)

    def _settings(self) -> dict[str, Any]:
        """The preview's sampling settings as ``draw``'s keywords (``per_class`` included)."""
        return dataclasses.asdict(self.sampling)

    def _jitted_draw(self, settings: dict[str, Any]) -> Callable[..., Any]:
        """``draw`` at ``settings``, jitted once per settings."""
        return jitted_once(self._jitted, tuple(sorted(settings.items())), self.draw, **settings)

    def _grid(self, samples: np.ndarray, columns: int) -> ImageGrid:
        finite = np.isfinite(samples.reshape(len(samples), -1)).all(axis=1)
        self._last_preview["nonfinite"] = int(np.sum(~finite))
        samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
        if self.latent is not None:
            samples = self.latent.to_images(samples)
        return ImageGrid(np.clip(samples, -1.0, 1.0), columns=columns)

    def preview(self, params: Params, rng: jax.Array) -> ImageGrid:
        """``per_class`` samples of every class (one row each) on the configured schedule."""
        settings = self._settings()
        samples = jax.device_get(self._jitted_draw(settings)(params, rng))
        return self._grid(np.asarray(samples), self.sampling.per_class)

    def score(self, preview: Any, metrics: Mapping[str, Callable[..., float]]) -> dict[str, float]:
        """Each metric(images, labels) on an image preview (the labels the rows were asked for);
        a preview with non-finite samples reports ``nonfinite_samples`` instead."""
        if not metrics:
            return {}
        if len(self.input_spec.sample.shape) != 3:
            raise ConfigError(
                f"config.preview.metrics={tuple(metrics)!r} is invalid: previews of "
                f"{self.input_spec.sample.shape}-shaped samples are not images; expected ()"
            )
        if preview is None:
            return {}
        if self._last_preview["nonfinite"]:
            return {"nonfinite_samples": float(self._last_preview["nonfinite"])}
        labels = np.repeat(np.arange(self.num_classes or 1), self.sampling.per_class)
        return {name: float(metric(preview.images, labels)) for name, metric in metrics.items()}

    # --- inference (dew.pipeline) -------------------------------------------------------------
    def inference_options(self) -> dict[str, Any]:
        """What ``dew.pipeline`` accepts; the defaults are the run's preview settings."""
        return {"classes": None, **self._settings(), "seed": 0}

    def infer(self, params: Params, *, classes, seed: int, **settings: Any) -> ImageGrid:
        """Samples as an ``ImageGrid``: without ``classes``, ``per_class`` of every class exactly as
        ``preview`` draws them (``seed`` = the run's seed reproduces its previews); with
        ``classes``, one sample per entry. ``schedule``: the t points, 1 … 0."""
        settings = dataclasses.asdict(type(self.sampling)(**settings))  # checked
        rng = jax.random.PRNGKey(seed)
        if classes is None:
            samples = jax.device_get(self._jitted_draw(settings)(params, rng))
            return self._grid(np.asarray(samples), settings["per_class"])
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
    def from_config(cls, config: Any, source: Any) -> MeanFlow:
        o = config.objective
        guidance = Guidance(o.guidance_eq, o.omega, o.kappa, o.class_dropout_prob, o.t_start, o.t_end)
        model = network_factory(config, "meanflow", ("h",))
        conditions, encoder, num_classes = class_conditions(config, source, guidance.uses_classes, "meanflow")
        field, latent, image_shape = sample_field(config, source)
        return cls(
            InputSpec(field, conditions),
            model,
            encoder,
            num_classes,
            times=TimeSampling(o.noise_dist, o.P_mean, o.P_std, o.data_proportion),
            guidance=guidance,
            weighting=Weighting(o.norm_p, o.norm_eps),
            sampling=MeanFlowSampling(**o.sampling.to_dict()),
            latent=latent,
            image_shape=image_shape,
            label_input=label_input(model),
            compute_dtype=compute_dtype_of(config),
        )


registry.objectives.register("meanflow", MeanFlow)
