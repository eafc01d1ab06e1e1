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
import functools
import inspect
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
from dew.inputs import Condition, Field, InputSpec
from dew.objectives import latent_space
from dew.objectives.diffusion_preview import jitted_once
from dew.objectives.diffusion_sampling import requested_classes
from dew.objectives.meanflow_loss import (
    Guidance,
    TimeSampling,
    Weighting,
    draw_meanflow,
    meanflow_loss,
)
from dew.objectives.whole import BuiltWhole
from dew.sampling.meanflow import check_schedule, sample_mean_flow
from dew.schema import ConfigError, Key, Section, at_least

ModuleFactory = Callable[[], Any]  # a registered network's constructor (a haiku module)


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


def takes_arguments(factory: Any, names: tuple[str, ...]) -> bool:
    """Whether the network ``factory`` builds is called with each of ``names`` (its ``__call__``
    declares them by name)."""
    target = factory.func if isinstance(factory, functools.partial) else factory
    call = target.__call__ if isinstance(target, type) else target
    try:
        parameters = inspect.signature(call).parameters
    except (TypeError, ValueError):
        return False
    return all(n in parameters for n in names)


def label_input(factory: Any) -> str:
    """How the network takes classes: ``"y"`` (int labels, positional, as DiT) when its
    ``__call__`` names ``y``, else ``"label"`` (the class encoder's vector, by keyword)."""
    return "y" if takes_arguments(factory, ("y",)) else "label"


def check_label_input(label_input: str) -> None:
    """``ValueError`` unless ``label_input`` is one of the two ways a network takes classes."""
    if label_input not in ("label", "y"):
        raise ValueError(f"label_input={label_input!r} is invalid: expected 'label' or 'y'")


def _constructor_takes(factory: Any, name: str) -> bool:
    target = factory.func if isinstance(factory, functools.partial) else factory
    try:
        return name in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def network_factory(config: Any, objective: str, arguments: tuple[str, ...]) -> ModuleFactory:
    """``config.model``'s registered network as a factory, refused (``ConfigError``) unless its
    ``__call__`` takes ``arguments`` (e.g. MeanFlow's second time input ``h``) and, for a network
    that builds its time inputs on request (``time_inputs``, DiT), it is asked for ``h``."""
    name = config.model.name
    if name is None:
        raise ConfigError(
            f"config.model.name=None is invalid: the {objective} objective needs a network taking "
            f"({', '.join(('x', 't', *arguments))}), one of {registry.models.names()}"
        )
    component = registry.models[name]
    if not takes_arguments(component, arguments):
        raise ConfigError(
            f"config.model.name={name!r} is invalid: the {objective} objective calls its network "
            f"with {', '.join(arguments)} (net(x, t, {', '.join(arguments)}, ...)), which {name} does "
            "not take; expected a network that does (e.g. unet, or an MF-/iMF- DiT)"
        )
    options = {k: v for k, v in config.model.items() if k != "name"}
    if _constructor_takes(component, "time_inputs"):
        preset = component.keywords if isinstance(component, functools.partial) else {}
        built = options.get("time_inputs", preset.get("time_inputs", ()))
        if "h" not in tuple(built or ()):
            raise ConfigError(
                f"config.model.time_inputs={tuple(built or ())!r} is invalid: the {objective} objective "
                f"feeds {name} a second time input h; expected ('t', 'h') (or ('h',) in context)"
            )
    return functools.partial(component, **options)


def class_conditions(config: Any, source: Any, needs_classes: bool, objective: str):
    """(conditions, encoder factory or None, num_classes or None) for ``config.objective.condition``;
    a ``ConfigError`` when guidance or class dropout is asked of data without classes."""
    choice = config.objective.condition
    if choice == "auto":
        choice = "class_label" if source.num_classes else "none"
    if choice == "class_label" and not source.num_classes:
        raise ConfigError(f"config.objective.condition='class_label': {source.name} has no classes")
    if choice == "none" and needs_classes:
        raise ConfigError(
            f"config.objective (name={objective!r}): guidance or class dropout is set but the model is "
            f"not class-conditional ({source.name} has no classes, or condition='none'); expected "
            "guidance_eq='none' and class_dropout_prob=0 for unconditional training"
        )
    if choice == "none":
        return {}, None, None
    conditions = {"label": Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)}
    encoder = functools.partial(registry.encoders["class_label"], source.num_classes)
    return conditions, encoder, int(source.num_classes)


def sample_field(config: Any, source: Any) -> tuple[Field, Any, tuple[int, ...] | None]:
    """(the model's sample field, the latent space or None, the decoded image shape or None)."""
    column = source.fields[source.sample_field]
    latent = latent_space.from_config(
        config.objective.get("latent"), latent_space.decodes_while_training(config)
    )
    shape = tuple(column.shape[1:])
    if latent is None:
        return Field(source.sample_field, shape), None, None
    model_shape = latent.sample_shape(shape)
    return Field(source.sample_field, model_shape), latent, latent.image_shape(model_shape)


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
        return sample_mean_flow(lambda z, t, h: u(z, t, h, y), noise, schedule)

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


def _schedule_ok(schedule: tuple[float, ...]) -> bool:
    try:
        check_schedule(schedule)
    except ValueError:
        return False
    return True


UNIT = {"check": lambda v: 0.0 <= v <= 1.0, "accepted": "a float in [0, 1]"}
SCHEDULE = Key(
    (1.0, 0.0),
    "the sampler's t points, 1 … 0: (1.0, 0.0) is one step, (1.0, 0.5, 0.0) two",
    item=float,
    check=_schedule_ok,
    accepted="t points strictly decreasing from 1.0 to 0.0, e.g. (1.0, 0.0) or (1.0, 0.5, 0.0)",
)
TIME_KEYS = {
    "P_mean": Key(-0.4, "logit-normal (t, r): mean of the normal before the sigmoid"),
    "P_std": Key(1.0, "logit-normal (t, r): its standard deviation", **at_least(0, "a float >= 0")),
    "data_proportion": Key(0.75, "fraction of the batch with r = t (flow matching rows)", **UNIT),
    "class_dropout_prob": Key(
        0.1, "probability behind the count of rows trained without their class (CFG's ∅)", **UNIT
    ),
    "norm_p": Key(
        1.0,
        "adaptive weight: L = ‖Δ‖² / sg(‖Δ‖² + norm_eps)^norm_p (0: plain L2)",
        # p = 1 − γ of the reference's robust loss ‖Δ‖^(2γ); the paper's ablation runs p in [0, 2].
        # p < 0 weights the largest errors up (a loss in the thousands), never an adaptive weight.
        check=lambda v: 0.0 <= v < float("inf"),
        accepted="a finite float >= 0 (0: plain L2; the papers use 0.5 and 1.0)",
    ),
    "norm_eps": Key(0.01, "adaptive weight's ε", **at_least(0, "a float >= 0")),
    "condition": Key(
        "auto",
        "class_label, none, or auto (class labels when the data has classes)",
        choices=("auto", "class_label", "none"),
    ),
    "latent": latent_space.CONFIG,
}


def _check_interval(section: Any, where: str) -> None:
    if not section.t_start <= section.t_end:
        raise ConfigError(
            f"config.{where}.t_start={section.t_start} / t_end={section.t_end} is invalid: "
            "expected t_start <= t_end"
        )


CONFIG = Section(
    "MeanFlow (Geng et al. 2025): average velocity u(z_t, t, h = t − r), trained with the JVP target",
    {
        "noise_dist": Key("logit_normal", "how t and r are drawn", choices=("logit_normal", "uniform")),
        **TIME_KEYS,
        "guidance_eq": Key("cfg", "guidance folded into training: cfg, or none", choices=("cfg", "none")),
        "omega": Key(
            1.0, "ω: weight of the sampled velocity in the guided target", **at_least(0, "a float >= 0")
        ),
        "kappa": Key(0.5, "κ: weight of the model's conditional velocity (0: plain CFG with scale ω)"),
        "t_start": Key(0.0, "guidance interval start: guided only for t in [t_start, t_end]", **UNIT),
        "t_end": Key(1.0, "guidance interval end", **UNIT),
        "sampling": Section(
            "how previews are sampled",
            {
                "schedule": SCHEDULE,
                "per_class": Key(10, "samples per class (one grid row each)", **at_least(1, "an int >= 1")),
            },
        ),
    },
    validate=_check_interval,
)

registry.objectives.register("meanflow", MeanFlow)
