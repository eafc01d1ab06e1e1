"""The ``imeanflow`` objective: improved MeanFlow (Lu et al. 2025; Lyy-iiis/imeanflow).

A sibling of ``meanflow``, not options of it: iMF's network has another interface, so the two
cannot share one. It is called as ``net(z, t, h, omega=ω, t_min=..., t_max=..., label=...,
is_training=...)`` — or, for a network that takes int labels as DiT does (dew's ``iMF-*``, its
in-context DiT), ``net(z, t, y, h=h, omega=ω, t_min=..., t_max=..., is_training=...)`` with the
null class ``num_classes`` — and returns (u, v), the average velocity and an auxiliary instantaneous
velocity head; it is conditioned on the guidance scale ω and interval [t_min, t_max], which are
drawn per example in training and chosen at sampling time (``sampling.omega``, ``t_min``,
``t_max``: the reference's recommended values are ω = 8, [0.4, 0.65] for iMF-B/2 and ω = 8,
[0.42, 0.62] for iMF-XL/2 at 1 NFE). The loss is ``dew.objectives.imeanflow_loss.imf_loss``.
Previews, inference and scoring are ``meanflow``'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dew import registry
from dew.contracts.objective import Aux, Batch, Params, Stats, Step
from dew.contracts.precision import compute_dtype_of
from dew.inputs import InputSpec
from dew.objectives import latent_space
from dew.objectives.imeanflow_loss import IMFGuidance, draw_imf, imf_loss
from dew.objectives.meanflow import MeanFlow
from dew.objectives.meanflow_config import SCHEDULE, TIME_KEYS, UNIT
from dew.objectives.meanflow_loss import TimeSampling, Weighting
from dew.objectives.model_inputs import (
    ModuleFactory,
    check_label_input,
    class_conditions,
    label_input,
    network_factory,
    sample_field,
)
from dew.sampling.meanflow import check_schedule, sample_mean_flow
from dew.schema import ConfigError, Key, Section, at_least

CONDITIONS = ("h", "omega", "t_min", "t_max")


@dataclasses.dataclass(frozen=True)
class IMFSampling:
    """How previews and inference sample: the t points, samples per class, and the guidance
    scale and interval the network is conditioned on (ω = 1: unguided)."""

    schedule: tuple[float, ...] = (1.0, 0.0)
    per_class: int = 10
    omega: float = 1.0
    t_min: float = 0.0
    t_max: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", check_schedule(self.schedule, "schedule"))
        if not (isinstance(self.per_class, int) and self.per_class >= 1):
            raise ValueError(f"per_class={self.per_class!r} is invalid: expected an int >= 1")
        if not self.omega >= 1.0:
            raise ValueError(f"omega={self.omega!r} is invalid: expected a float >= 1 (1: unguided)")
        if not 0.0 <= self.t_min <= self.t_max <= 1.0:
            raise ValueError(
                f"(t_min, t_max)=({self.t_min}, {self.t_max}) is invalid: expected 0 <= t_min <= t_max <= 1"
            )


class IMeanFlow(MeanFlow):
    """improved MeanFlow training and sampling (module docstring); built whole here."""

    def __init__(
        self,
        input_spec: InputSpec,
        model: ModuleFactory,
        encoder: ModuleFactory | None,
        num_classes: int | None,
        *,
        times: TimeSampling | None = None,
        guidance: IMFGuidance | None = None,
        weighting: Weighting | None = None,
        sampling: IMFSampling | None = None,
        latent: latent_space.LatentSpace | None = None,
        image_shape: tuple[int, ...] | None = None,
        label_input: str = "label",
        compute_dtype: str = "float32",
    ):
        times = times or TimeSampling(data_proportion=0.5)
        check_label_input(label_input)
        if times.noise_dist != "logit_normal":
            raise ValueError(f"noise_dist={times.noise_dist!r} is invalid: iMF draws (t, r) logit-normal")
        if num_classes is None or encoder is None:
            raise ValueError(
                "IMeanFlow: iMF trains with guidance and needs classes (a class encoder and num_classes)"
            )
        self._hold(
            input_spec,
            model,
            encoder,
            num_classes,
            times=times,
            guidance=guidance or IMFGuidance(),
            weighting=weighting or Weighting(),
            sampling=sampling or IMFSampling(),
            latent=latent,
            image_shape=image_shape,
            label_input=label_input,
            compute_dtype=compute_dtype,
        )

    @staticmethod
    def _forward(model: ModuleFactory, encoder: ModuleFactory | None, label_input: str) -> Callable[..., Any]:
        def forward(x, t, h, omega, t_min, t_max, labels, is_training):
            if label_input == "y":
                return model()(
                    x, t, labels, h=h, omega=omega, t_min=t_min, t_max=t_max, is_training=is_training
                )
            assert encoder is not None, "label_input='label' networks take an encoded label"
            label = encoder()(labels)
            return model()(
                x, t, h, omega=omega, t_min=t_min, t_max=t_max, label=label, is_training=is_training
            )

        return forward

    def imf_network(self, params: Params, rng: jax.Array | None, is_training: bool):
        """(z, t, h, ω, t_min, t_max, y) -> (u, v): the network with ``params``."""

        def net(z, t, h, omega, t_min, t_max, y):
            return self._apply(params, rng, z, t, h, omega, t_min, t_max, y, is_training)

        return net

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        y = batch[self.input_spec.sample.name]
        x = y if self.latent is None else self.latent.mean(y)
        t = jnp.zeros(x.shape[:1])
        one = jnp.ones(x.shape[:1])
        return self._net.init(rng, x, t, t, one, t, one, batch["label"], True)

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        draw_rng, net_rng = jax.random.split(rng)
        x = self.training_sample(batch, rng)
        draws = draw_imf(draw_rng, x)
        net = self.imf_network(params, net_rng, step.is_training)
        terms = imf_loss(
            net, x, batch["label"], draws, self.times, self.guidance, self.weighting, self.null_label
        )
        return terms.loss, ({"loss_u": terms.loss_u, "loss_v": terms.loss_v}, Aux())

    def generate(
        self,
        params: Params,
        rng: jax.Array,
        labels: jax.Array | None = None,
        *,
        schedule: tuple[float, ...] = (1.0, 0.0),
        omega: float = 1.0,
        t_min: float = 0.0,
        t_max: float = 1.0,
        num_samples: int | None = None,
    ) -> jax.Array:
        """Samples for ``labels`` [n] along ``schedule`` at guidance scale ``omega`` inside
        [``t_min``, ``t_max``] (the network's conditioning; the reference's ``generate``)."""
        del num_samples  # iMF is class-conditional: one sample per label
        if labels is None:
            raise ValueError("improved MeanFlow is class-conditional: give labels")
        n = labels.shape[0]
        noise = jax.random.normal(rng, (n, *self.input_spec.sample.shape), jnp.float32)
        net = self.imf_network(params, None, False)
        full = jnp.ones((n,), jnp.float32)

        def u(z, t, h):
            return net(z, t, h, omega * full, t_min * full, t_max * full, labels)[0]

        return sample_mean_flow(u, noise, schedule)

    @classmethod
    def config_section(cls) -> Section:
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> IMeanFlow:
        o = config.objective
        model = network_factory(config, "imeanflow", CONDITIONS)
        conditions, encoder, num_classes = class_conditions(config, source, True, "imeanflow")
        field, latent, image_shape = sample_field(config, source)
        return cls(
            InputSpec(field, conditions),
            model,
            encoder,
            num_classes,
            times=TimeSampling("logit_normal", o.P_mean, o.P_std, o.data_proportion),
            guidance=IMFGuidance(o.cfg_beta, o.class_dropout_prob),
            weighting=Weighting(o.norm_p, o.norm_eps),
            sampling=IMFSampling(**o.sampling.to_dict()),
            latent=latent,
            image_shape=image_shape,
            label_input=label_input(model),
            compute_dtype=compute_dtype_of(config),
        )


def _check_sampling(section: Any, where: str) -> None:
    s = section.sampling
    if not s.t_min <= s.t_max:
        raise ConfigError(
            f"config.{where}.sampling.t_min={s.t_min} / t_max={s.t_max} is invalid: expected t_min <= t_max"
        )


CONFIG = Section(
    "improved MeanFlow (Lu et al. 2025): the compound-velocity loss, ω- and interval-conditioned network",
    {
        **{k: v for k, v in TIME_KEYS.items() if k != "data_proportion"},
        "data_proportion": Key(0.5, "fraction of the batch with r = t (flow matching rows)", **UNIT),
        "cfg_beta": Key(
            1.0, "law of the training guidance scale ω on [1, 8]: 1 log-uniform, else a power law"
        ),
        "sampling": Section(
            "how previews are sampled",
            {
                "schedule": SCHEDULE,
                "per_class": Key(10, "samples per class (one grid row each)", **at_least(1, "an int >= 1")),
                "omega": Key(
                    1.0,
                    "guidance scale ω the network is conditioned on (1: none)",
                    **at_least(1, "a float >= 1"),
                ),
                "t_min": Key(0.0, "guidance interval start", **UNIT),
                "t_max": Key(1.0, "guidance interval end", **UNIT),
            },
        ),
    },
    validate=_check_sampling,
)

registry.objectives.register("imeanflow", IMeanFlow)
