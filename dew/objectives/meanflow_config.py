"""``config.objective`` of the ``meanflow`` objective (and the keys ``imeanflow`` shares): how t and
r are drawn, the adaptive weighting, guidance folded into training, and the sampler's t points."""

from __future__ import annotations

from typing import Any

from dew.objectives import latent_space
from dew.sampling.meanflow import check_schedule
from dew.schema import ConfigError, Key, Section, at_least


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
