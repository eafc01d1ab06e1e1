"""``config.objective`` of the ``interpolant`` objective (SiT's transport loss, REPA's alignment)
and how its previews and ``dew.pipeline`` draw: a registered transport sampler by name
(``transport_sampler``), the preview settings (``Preview``) and SiT's classifier-free guidance
on an interval (``Guidance``). ``dew.objectives.interpolant`` re-exports them."""

from __future__ import annotations

import dataclasses
from typing import Any

from dew import registry
from dew.diffusion.interpolants import LOSS_WEIGHTS, PATHS, PREDICTIONS
from dew.diffusion.transport import Transport
from dew.objectives import latent_space
from dew.objectives.repa_config import CONFIG_REPA, validate_repa
from dew.sampling.repa_sampler import RepaSampler, path_type
from dew.sampling.transport_ode import TransportODE
from dew.sampling.transport_sde import TransportSDE
from dew.schema import ConfigError, Key, Section, at_least

TransportSampler = TransportODE | TransportSDE | RepaSampler


def transport_sampler(name: str) -> TransportSampler:
    """The registered SiT or REPA sampler ``name`` (``transport_ode``, ``transport_sde``,
    ``repa_sde``, ...); a ``ConfigError`` naming the registered ones for any other name."""
    accepted = sorted(
        n for n in registry.samplers.names() if isinstance(registry.samplers[n], TransportSampler)
    )
    if name not in accepted:
        raise ConfigError(
            f"config.objective.sampling.sampler={name!r} is unknown: expected one of {accepted} "
            "(the registered transport samplers)"
        )
    return registry.samplers[name]


@dataclasses.dataclass(frozen=True)
class Preview:
    """How ``Interpolant.preview`` (and ``dew.pipeline``) draws: a registered transport sampler,
    its number of steps (``num_steps``), ``per_class`` samples per class (in all, without
    classes), and classifier-free guidance (``Guidance``: ``cfg_scale``, ``cfg_channels``,
    ``guidance_interval``)."""

    sampler: str = "transport_ode"
    steps: int = 50
    per_class: int = 8
    cfg_scale: float = 1.0
    cfg_channels: int = 3
    guidance_interval: tuple[float, float] = (0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Guidance:
    """SiT's ``sample.py`` guidance: the batch doubled with the null class (label
    ``num_classes``), the network's ``forward_with_cfg`` at ``cfg_scale`` on the first
    ``cfg_channels`` output channels (3, as SiT's), the first half kept; applied only for t in
    ``interval`` = [t_lo, t_hi] (SiT's time: 0 noise, 1 data), the conditional output elsewhere
    (REPA's guidance interval; REPA's own time runs the other way, so its [low, high] is
    [1 − high, 1 − low] here). ``cfg_scale`` 1 is no guidance (one conditional call)."""

    cfg_scale: float = 1.0
    cfg_channels: int = 3
    interval: tuple[float, float] = (0.0, 1.0)

    def __post_init__(self) -> None:
        lo, hi = (float(v) for v in self.interval)
        object.__setattr__(self, "interval", (lo, hi))
        if not (isinstance(self.cfg_scale, int | float) and self.cfg_scale >= 1.0):
            raise ValueError(f"cfg_scale={self.cfg_scale!r} is invalid: expected a float >= 1")
        if not (isinstance(self.cfg_channels, int) and self.cfg_channels >= 1):
            raise ValueError(f"cfg_channels={self.cfg_channels!r} is invalid: expected an int >= 1")
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(
                f"guidance_interval={self.interval!r} is invalid: expected (t_lo, t_hi) with "
                "0 <= t_lo <= t_hi <= 1"
            )

    @classmethod
    def of(cls, preview: Preview) -> Guidance:
        lo, hi = preview.guidance_interval
        return cls(preview.cfg_scale, preview.cfg_channels, (lo, hi))


def _validate(section: Any, path: str) -> None:
    Transport.create(
        section.path, section.prediction, section.loss_weight, section.train_eps, section.sample_eps
    )
    if isinstance(transport_sampler(section.sampling.sampler), RepaSampler):
        path_type(Transport.create(section.path))
    s = section.sampling
    try:
        Guidance(s.cfg_scale, s.cfg_channels, tuple(s.guidance_interval))
    except ValueError as e:
        raise ConfigError(f"config.objective.sampling.{e}") from None
    validate_repa(section.repa)


CONFIG = Section(
    "SiT's transport loss (stochastic interpolants)",
    {
        "path": Key("Linear", "the interpolant: Linear, GVP or VP", choices=tuple(PATHS)),
        "prediction": Key("velocity", "what the network predicts", choices=PREDICTIONS),
        "loss_weight": Key(
            None, "score/noise loss weighting: None, velocity or likelihood", kind=str, choices=LOSS_WEIGHTS
        ),
        "train_eps": Key(None, "training time margin (None: SiT's default for the path)", kind=float),
        "sample_eps": Key(None, "sampling time margin (None: SiT's default for the path)", kind=float),
        "learn_sigma": Key(
            False, "the network returns 2C channels (DiT/SiT learn_sigma); the loss uses the first C"
        ),
        "latent": latent_space.CONFIG,
        "condition": Key(
            "auto",
            "conditioning: class_label, none, or auto (labels when the data has classes)",
            choices=("auto", "class_label", "none"),
        ),
        "repa": CONFIG_REPA,
        "sampling": Section(
            "how previews are sampled",
            {
                "sampler": Key("transport_ode", "registered transport sampler (dew.samplers)"),
                "steps": Key(50, "the sampler's num_steps", **at_least(2, "an int >= 2")),
                "per_class": Key(8, "samples per class (one grid row each)", **at_least(1, "an int >= 1")),
                "cfg_scale": Key(
                    1.0, "classifier-free guidance scale (1: none)", **at_least(1, "a float >= 1")
                ),
                "cfg_channels": Key(3, "output channels guidance applies to (SiT: the first 3)"),
                "guidance_interval": Key(
                    (0.0, 1.0),
                    "guide only for t in [t_lo, t_hi] (SiT time: 0 noise, 1 data)",
                    item=float,
                    check=lambda v: len(v) == 2 and 0.0 <= v[0] <= v[1] <= 1.0,
                    accepted="(t_lo, t_hi) with 0 <= t_lo <= t_hi <= 1",
                ),
            },
        ),
    },
    validate=_validate,
)
