"""The ``diffusion`` objective's config section (``config.objective`` when its name is
"diffusion"), its sampling settings (also checked when given at inference time), and the
constructor arguments a resolved config gives (``arguments``: all ``from_config`` computes)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from dew import registry
from dew.augment.settings import CONFIG as AUGMENT
from dew.contracts.precision import compute_dtype_of
from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import Condition, Field, InputSpec
from dew.objectives import diffusion_augment, latent_space, scatter
from dew.objectives.latent_space import CONFIG as LATENT
from dew.sampling.solvers import Solver
from dew.schema import ConfigError, Key, Section, at_least


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How ``Diffusion.preview`` samples: ``config.objective.sampling``."""

    steps: int = 18
    solver: str = "heun"
    per_class: int = 10
    guidance: float = 1.0
    guidance_interval: tuple[float, ...] = ()


def _interval_ok(interval: tuple[float, ...]) -> bool:
    return interval == () or (len(interval) == 2 and 0 <= interval[0] < interval[1])


def sigma_solvers() -> list[str]:
    """The registered samplers that integrate dew's σ-parameterised ODE/SDE (``Solver``s): what
    ``objective.sampling.solver`` accepts. Other registered samplers (SiT's transport samplers,
    MeanFlow's) belong to their own objectives."""
    return sorted(n for n in registry.samplers.names() if isinstance(registry.samplers[n], Solver))


def _is_sigma_solver(name: str) -> bool:
    return name in sigma_solvers()


def check_sampling(s: Sampling) -> None:
    """The sampling section's checks, for settings given at inference time."""
    if not (isinstance(s.steps, int) and s.steps >= 2):
        raise ValueError(f"steps={s.steps!r} is invalid: expected an int >= 2")
    if not _is_sigma_solver(s.solver):
        raise ValueError(f"solver={s.solver!r} is invalid: expected one of {sigma_solvers()}")
    if not (isinstance(s.per_class, int) and s.per_class >= 1):
        raise ValueError(f"per_class={s.per_class!r} is invalid: expected an int >= 1")
    if not (isinstance(s.guidance, int | float) and s.guidance >= 0):
        raise ValueError(f"guidance={s.guidance!r} is invalid: expected a float >= 0 (1: none)")
    if not _interval_ok(s.guidance_interval):
        raise ValueError(
            f"guidance_interval={s.guidance_interval!r} is invalid: expected () or (σ_lo, σ_hi) with "
            "0 <= σ_lo < σ_hi"
        )


CONFIG = Section(
    "denoising score matching in the EDM frame (Karras et al. 2022)",
    {
        "preset": Key("EDM", "preconditioning, loss weight and σ schedule (dew.presets)", registry="presets"),
        "condition": Key(
            "auto",
            "conditioning: text, class_label, none, or auto (text if the data has it, else labels)",
            choices=("auto", "text", "class_label", "none"),
        ),
        "condition_dropout": Key(
            0.0,
            "probability of dropping a condition while training (the unconditional branch of CFG)",
            check=lambda v: 0.0 <= v < 1.0,
            accepted="a float in [0, 1)",
        ),
        "augment": AUGMENT,
        "latent": LATENT,
        "sampling": Section(
            "how previews are sampled",
            {
                "steps": Key(18, "sampler points from σ_max to 0", **at_least(2, "an int >= 2")),
                "solver": Key(
                    "heun",
                    "registered solver (dew.samplers)",
                    registry="samplers",
                    check=_is_sigma_solver,
                    accepted="a σ solver (a dew.sampling.solvers.Solver, e.g. euler, heun, dpmpp_2m)",
                ),
                "per_class": Key(
                    10,
                    "samples per class (one grid row each); in all, without classes",
                    **at_least(1, "an int >= 1"),
                ),
                "guidance": Key(
                    1.0,
                    "classifier-free guidance weight (1: none)",
                    **at_least(0, "a float >= 0 (1: none)"),
                ),
                "guidance_interval": Key(
                    (),
                    "() guides over the whole σ range; (σ_lo, σ_hi) only there, e.g. (0.28, 2.9)",
                    item=float,
                    check=_interval_ok,
                    accepted="() for the whole σ range, or (σ_lo, σ_hi) with 0 <= σ_lo < σ_hi",
                ),
            },
        ),
    },
)


def arguments(config: Any, source: Any) -> dict[str, Any]:
    """The ``Diffusion`` constructor's arguments for ``config.objective``/``config.model`` and a
    dataset ``source`` (the training split's): ``Diffusion(**arguments(config, source))`` is
    what ``from_config`` builds. The latent space's VAE, when configured, is loaded here.

    ``config.objective.condition`` picks the conditioning: ``text`` (the source's ``text`` field
    through the jointly trained ``byte_text`` encoder), ``class_label`` (its ``label`` field), or
    ``none``; ``auto`` takes text when the source has a ``text`` field, else class labels when it
    has ``num_classes``. Either is passed to the model under its ``label`` keyword; a
    text-conditioned model's previews draw each class's prompt (the source's ``class_prompts``,
    else the class numbers). ``config.objective.sampling`` sets how previews sample; point
    samples ([N, D]) are shown over the extent of the data's first 4096 points."""
    o = config.objective
    if config.model.name is None:
        raise ConfigError(
            f"config.model.name=None is invalid: the diffusion objective needs a network, one of "
            f"{registry.models.names()}"
        )
    column = source.fields[source.sample_field]
    latent = latent_space.from_config(o.get("latent"), latent_space.decodes_while_training(config))
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
    encoders: dict[str, Any] = {}
    if choice == "class_label":
        conditions["label"] = Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)
        encoders["label"] = functools.partial(registry.encoders["class_label"], source.num_classes)
    elif choice == "text":
        length = int(source.fields["text"].shape[1])
        conditions["label"] = Condition("byte_text", Field("text", (length,), "int32"), "")
        encoders["label"] = functools.partial(registry.encoders["byte_text"], max_length=length)
    augment, augment_labels = diffusion_augment.from_config(config, sample_field.shape)
    model_cfg = {k: v for k, v in config.model.items() if k != "name"}
    class_prompts = None
    if choice == "text":
        class_prompts = source.class_prompts or tuple(str(c) for c in range(source.num_classes or 0))
    extent = None
    if len(sample_field.shape) == 1:  # points: previews are scatter plots over the data's extent
        extent = scatter.extent_of(np.asarray(column[: min(len(column), 4096)]))
    return {
        "input_spec": InputSpec(sample_field, conditions),
        "process": registry.presets[o.preset],
        "model": functools.partial(registry.models[config.model.name], **model_cfg),
        "encoders": encoders,
        "condition_dropout": o.condition_dropout,
        "sampling": Sampling(**o.sampling.to_dict()),
        "augment": augment,
        "augment_labels": augment_labels,
        "compute_dtype": compute_dtype_of(config),
        "num_classes": source.num_classes if conditions else None,
        "class_prompts": class_prompts,
        "latent": latent,
        "extent": extent,
    }
