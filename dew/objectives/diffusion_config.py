"""The ``diffusion`` objective's config section (``config.objective`` when its name is
"diffusion") and its sampling settings, also checked when given at inference time."""

from __future__ import annotations

import dataclasses

from dew import registry
from dew.augment.settings import CONFIG as AUGMENT
from dew.objectives.latent_space import CONFIG as LATENT
from dew.schema import Key, Section, at_least


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


def check_sampling(s: Sampling) -> None:
    """The sampling section's checks, for settings given at inference time."""
    if not (isinstance(s.steps, int) and s.steps >= 2):
        raise ValueError(f"steps={s.steps!r} is invalid: expected an int >= 2")
    if s.solver not in registry.samplers:
        raise ValueError(f"solver={s.solver!r} is invalid: expected one of {sorted(registry.samplers)}")
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
                "solver": Key("heun", "registered solver (dew.samplers)", registry="samplers"),
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
