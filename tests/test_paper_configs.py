"""Each row of ``experiments/edm_paper.py`` resolves to what NVlabs/edm's own ``train.py`` resolves.

``third_party/edm/train_options.json`` is the reference's ``train.py --dry-run`` options dict for
every published model (and the VP/VE baselines), with what its training loop derives from it
(the network, preconditioner, loss, augmentation pipe and loop arguments, defaults applied; see
``third_party/edm/make_train_options.py``). For every row, every leaf of that record is either
compared with the dew setting it corresponds to (``RULES``) or named in ``NOT_SETTINGS`` with the
reason it has no counterpart (I/O cadence, host loader, GPU memory). A reference leaf that is in
neither, a differing value, or a dew row missing, fails the test naming the setting.

Derived numbers (images → updates, the loss scale folded into Adam's ε) are compared after one
division in the config and one multiplication here: two float64 roundings, each at most half an
ulp, so a relative tolerance of 2·2⁻⁵³ (doubled to 4·2⁻⁵³ for margin) bounds their difference.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dew import registry
from dew.config import load_config
from dew.data.sources import cifar10 as cifar10_source
from dew.training.trainer import resolve_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENT = os.path.join(ROOT, "experiments", "edm_paper.py")
with open(os.path.join(ROOT, "third_party", "edm", "train_options.json")) as _file:
    REFERENCE = json.load(_file)["rows"]
ROUNDING = 4 * 2.0**-53  # two float64 roundings (module docstring)

_spec = importlib.util.spec_from_file_location("edm_paper", EXPERIMENT)
assert _spec is not None and _spec.loader is not None
edm_paper = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(edm_paper)

PRESET = {
    "EDMPrecond": "EDM",
    "VPPrecond": "VP",
    "VEPrecond": "VE",
    "EDMLoss": "EDM",
    "VPLoss": "VP",
    "VELoss": "VE",
}
MODEL = {"SongUNet": "songunet", "DhariwalUNet": "dhariwalunet"}
# Reference arguments of the preconditioners and losses → the field of dew's preset Process.
PROCESS_FIELD = {
    "sigma_data": "sigma_data",
    "P_mean": "p_mean",
    "P_std": "p_std",
    "beta_d": "beta_d",
    "beta_min": "beta_min",
    "M": "m",
    "epsilon_t": "eps_t",
    "sigma_min": "sigma_min",
    "sigma_max": "sigma_max",
}

NOT_SETTINGS = {
    "options": "the command line itself",
    "precond.sigma_min": "EDMPrecond's clamp of the σ range a sampler may ask for (0: none); "
    "dew's sampler takes its range from the preset and objective.sampling",
    "precond.sigma_max": "EDMPrecond's clamp of the σ range a sampler may ask for (∞: none)",
    "training_loop.batch_gpu": "a per-GPU memory limit (gradient accumulation to the same batch): "
    "dew's train.accumulation with a smaller dataset.batch_size, images per update unchanged",
    "training_loop.seed": "train.py draws a random seed unless --seed is given (--seed=0 here); dew: seed",
    "training_loop.cudnn_benchmark": "a cuDNN autotuning switch, not a training setting",
    "training_loop.kimg_per_tick": "progress-print cadence (dew: train.log_every)",
    "training_loop.snapshot_ticks": "snapshot cadence (dew: checkpoint.every)",
    "training_loop.state_dump_ticks": "training-state cadence (dew: checkpoint.every)",
    "training_loop.resume_kimg": "resuming (dew resumes from its workdir)",
    "training_loop.resume_pkl": "resuming (dew resumes from its workdir)",
    "training_loop.resume_state_dump": "resuming (dew resumes from its workdir)",
    "train_py.data_loader_kwargs.num_workers": "torch DataLoader workers (dew's cache gathers in memory)",
    "train_py.data_loader_kwargs.pin_memory": "torch DataLoader pinned memory",
    "train_py.data_loader_kwargs.prefetch_factor": "torch DataLoader prefetch",
    "train_py.dataset_kwargs.class_name": "the reader of dataset_tool.py's format (dew: image_folder; "
    "CIFAR-10 from tfds's copy of the same 50,000 training images)",
}


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of a JSON tree by dotted path (lists are leaves)."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out if tree else {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def same(a: Any, b: Any) -> bool:
    """Equal as settings: sequences elementwise (list vs tuple), numbers as numbers."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=ROUNDING, abs_tol=0.0)


def images_per_update(config: Any) -> int:
    return config.dataset.batch_size * config.train.accumulation


def pixels(ref: dict) -> int:
    i = ref["interface_kwargs"]
    return i["img_resolution"] ** 2 * i["img_channels"]


def dataset_resolution(config: Any) -> int:
    if config.dataset.name == "cifar10":
        return cifar10_source.SHAPE[0]
    return config.dataset.resolution


# dew network settings with no reference counterpart because they change how, not what, is
# computed (each has its own test that the numbers stay the same).
SAME_NUMBERS = {
    "remat": "per-block rematerialisation (tests/system/test_remat.py)",
    "scan_blocks": "runs of identical blocks as one lax.scan (tests/system/test_scan_blocks.py)",
}


def precision(config: Any) -> dict:
    """dew's precision policy as the row resolves it (float32 without a loss scale by default)."""
    section = config.get("precision", {})
    policy = {k: section.get(k, v) for k, v in (("compute", "float32"), ("loss_scale", "none"))}
    return policy if policy["loss_scale"] == "none" else {**policy, "scale": section.get("scale")}


# A rule: (reference leaf, its value, the whole reference row, the dew config) ->
# (the dew setting's name, its value or what it implies, whether they agree).
Rule = Callable[[str, Any, dict, Any], tuple[str, Any, bool]]


def dew_key(path: str) -> Rule:
    def rule(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
        dew = config
        for part in path.split("."):
            dew = dew[part]
        return path, dew, same(value, dew)

    return rule


def process_field(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    field = PROCESS_FIELD[leaf.rsplit(".", 1)[1]]
    preset = registry.presets[config.objective.preset]
    return (
        f"objective.preset={config.objective.preset}.{field}",
        getattr(preset, field),
        same(value, getattr(preset, field)),
    )


def preset_class(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    return "objective.preset", config.objective.preset, PRESET[value] == config.objective.preset


def model_rule(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    key = leaf.split(".", 1)[1]
    if key == "class" or leaf == "precond.model_type":
        return "model.name", config.model.name, MODEL[value] == config.model.name
    if key == "img_resolution":
        return "the data's resolution", dataset_resolution(config), same(value, dataset_resolution(config))
    if key in ("in_channels", "out_channels"):
        # dew's networks read in_channels from the input; out_channels None means in_channels.
        return (
            "model.out_channels",
            config.model.out_channels,
            config.model.out_channels is None and value == 3,
        )
    if key == "label_dropout":
        return (
            "objective.condition_dropout",
            config.objective.condition_dropout,
            same(value, config.objective.condition_dropout),
        )
    return dew_key(f"model.{key}")(leaf, value, ref, config)


def interface_rule(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    key = leaf.split(".", 1)[1]
    if key == "img_resolution":
        return "the data's resolution", dataset_resolution(config), same(value, dataset_resolution(config))
    if key == "img_channels":  # CIFAR-10's tfds records are checked against SHAPE; dataset_tool.py writes RGB
        channels = cifar10_source.SHAPE[2] if config.dataset.name == "cifar10" else 3
        return "the data's channels", channels, value == channels
    if key == "label_dim":
        return dew_key("model.label_dim")(leaf, value, ref, config)
    if key == "use_fp16":
        # --fp16 is float16 compute under the static loss scale --ls; without it, float32.
        policy = precision(config)
        if not value:
            return "precision", policy, policy == {"compute": "float32", "loss_scale": "none"}
        ls = ref["training_loop"]["loss_scaling"]
        wanted = {"compute": "float16", "loss_scale": "static", "scale": ls}
        return "precision", policy, policy == wanted
    if key == "model_type":
        return model_rule(leaf, value, ref, config)
    raise KeyError(leaf)


def augment_rule(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    if value is None:  # no pipe: p = 0 (no augmentation, no labels)
        return "objective.augment.p", config.objective.augment.p, config.objective.augment.p == 0
    return dew_key(f"objective.augment.{leaf.split('.', 1)[1]}")(leaf, value, ref, config)


def per_image(dew_path: str, kimg: bool) -> Rule:
    """A reference count of images (kimg: ×1000) against a dew count of updates × B."""

    def rule(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
        images = value * 1000 if kimg else value
        dew = config
        for part in dew_path.split("."):
            dew = dew[part]
        return dew_path, dew, close(dew * images_per_update(config), images)

    return rule


def duration(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    """The reference's last update is the first to reach total_kimg·1000 images."""
    n, batch, total = config.train.num_steps, images_per_update(config), value * 1000
    steps = n // config.train.accumulation if config.train.accumulation else n
    return (
        "train.num_steps",
        n,
        n % config.train.accumulation == 0 and steps * batch >= total > (steps - 1) * batch,
    )


def adam_eps(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    """The reference's ε with its loss (per-image pixel sum × ls) = dew's ε with the per-pixel mean."""
    scale = pixels(ref) * ref["training_loop"]["loss_scaling"]
    eps = ref["train_py"]["optimizer_kwargs"]["eps"]
    return "optimizer.eps", config.optimizer.eps, close(config.optimizer.eps * scale, eps)


def constant(dew_name: str, dew_value: Any) -> Rule:
    def rule(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
        return dew_name, dew_value, same(value, dew_value)

    return rule


def betas(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    dew = (config.optimizer.b1, config.optimizer.b2)
    return "optimizer.b1, optimizer.b2", dew, same(value, dew)


def batch(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    return (
        "dataset.batch_size × train.accumulation",
        images_per_update(config),
        value == images_per_update(config),
    )


def dataset_path(leaf: str, value: Any, ref: dict, config: Any) -> tuple[str, Any, bool]:
    if config.dataset.name == "cifar10":  # tfds's cifar10, the same images as dataset_tool.py's zip
        return "dataset.name", "cifar10", value == "datasets/cifar10-32x32.zip"
    return dew_key("dataset.path")(leaf, value, ref, config)


def rule_for(leaf: str) -> Rule | None:
    """The rule comparing a reference leaf, or None when it has none (a test failure)."""
    section, _, key = leaf.partition(".")
    if section == "model":
        return model_rule
    if section in ("interface_kwargs", "precond"):
        if key == "class":
            return preset_class
        if key in PROCESS_FIELD:
            return process_field
        return interface_rule
    if section == "loss":
        return preset_class if key == "class" else process_field if key in PROCESS_FIELD else None
    if section == "augment":
        return augment_rule
    fixed: dict[str, Rule] = {
        "training_loop.batch_size": batch,
        "training_loop.total_kimg": duration,
        "training_loop.ema_halflife_kimg": per_image("ema.half_life", kimg=True),
        "training_loop.ema_rampup_ratio": dew_key("ema.ramp_up"),
        "training_loop.lr_rampup_kimg": per_image("optimizer.warmup_steps", kimg=True),
        "training_loop.loss_scaling": adam_eps,
        "train_py.optimizer_kwargs.class_name": constant(
            "dew's optimizer (make_optimizer)", "torch.optim.Adam"
        ),
        "train_py.optimizer_kwargs.lr": dew_key("optimizer.learning_rate"),
        "train_py.optimizer_kwargs.betas": betas,
        "train_py.optimizer_kwargs.eps": adam_eps,
        "train_py.dataset_kwargs.path": dataset_path,
        "train_py.dataset_kwargs.use_labels": dew_key("dataset.use_labels"),
        "train_py.dataset_kwargs.xflip": dew_key("dataset.xflip"),
        "train_py.dataset_kwargs.cache": dew_key("dataset.cache"),
        "train_py.dataset_kwargs.resolution": lambda leaf, v, ref, c: interface_rule(
            "i.img_resolution", v, ref, c
        ),
    }
    return fixed.get(leaf)


def reference_leaves(ref: dict) -> dict[str, Any]:
    leaves = flatten({k: v for k, v in ref.items() if k != "augment"})
    if ref["augment"] is None:
        leaves["augment"] = None
    else:
        leaves.update(flatten({"augment": ref["augment"]}))
    # train.py's own entries that the resolved sections repeat, and its loop arguments (in
    # training_loop), are compared once, there.
    kept = {"train_py.optimizer_kwargs", "train_py.dataset_kwargs", "train_py.data_loader_kwargs"}
    return {k: v for k, v in leaves.items() if not k.startswith("train_py.") or k.rsplit(".", 1)[0] in kept}


def differences(row: str, compared: list | None = None) -> list[str]:
    """Every reference setting of ``row`` that dew's resolved config lacks or sets differently;
    ``compared`` (if given) collects (reference leaf, value, dew setting, dew value)."""
    config = resolve_config(load_config(f"{EXPERIMENT}:{row}"))
    ref = REFERENCE[edm_paper.ROWS[row].reference]
    problems = []
    for leaf, value in sorted(reference_leaves(ref).items()):
        if leaf in NOT_SETTINGS:
            continue
        rule = rule_for(leaf)
        if rule is None:
            problems.append(f"{row}: reference setting {leaf}={value!r} has no dew counterpart")
            continue
        try:
            name, dew, ok = rule(leaf, value, ref, config)
        except (KeyError, AttributeError) as e:
            problems.append(f"{row}: reference setting {leaf}={value!r}: dew's config lacks {e}")
            continue
        if compared is not None:
            compared.append((leaf, value, name, dew))
        if not ok:
            problems.append(f"{row}: {leaf}={value!r} but dew's {name}={dew!r}")
    # The other way round: a dew network or augmentation setting the reference does not have
    # (bar the implementation choices that leave the numbers as they are).
    model_keys = set(ref["model"]) | {"name"} | set(SAME_NUMBERS)
    problems += [
        f"{row}: dew setting model.{k} has no reference counterpart"
        for k in config.model
        if k not in model_keys
    ]
    if ref["augment"] is not None:  # (without a pipe only p = 0 matters, compared above)
        problems += [
            f"{row}: dew setting objective.augment.{k} has no reference counterpart"
            for k in config.objective.augment
            if k not in ref["augment"]
        ]
    return problems


FLOAT32_ROWS = [row for row, r in edm_paper.ROWS.items() if not r.fp16]
FP16_ROWS = [row for row, r in edm_paper.ROWS.items() if r.fp16]


def test_every_reference_row_has_one_experiment_row():
    references = [r.reference for r in edm_paper.ROWS.values()]
    assert sorted(references) == sorted(REFERENCE), "rows without an experiment: " + ", ".join(
        sorted(set(REFERENCE) - set(references))
    )
    assert len(set(references)) == len(references)
    assert FP16_ROWS == ["imagenet64-cond-adm"]


@pytest.mark.parametrize("row", FLOAT32_ROWS + FP16_ROWS)
def test_row_resolves_to_what_train_py_resolves(row):
    problems = differences(row)
    assert not problems, "\n".join(problems)


def test_unknown_row_is_one_line():
    with pytest.raises(Exception, match=r"not a row; expected one of \[.*cifar10-cond-ddpmpp"):
        load_config(f"{EXPERIMENT}:cifar10-cond")


def test_learning_rate_ramp_is_the_reference_formula():
    """dew's schedule at update n is lr·min(n·B / (lr_rampup_kimg·1000), 1), the reference's."""
    import numpy as np

    from dew.training.learning_rate import linear_warmup

    config = resolve_config(load_config(f"{EXPERIMENT}:imagenet64-cond-adm"))
    lr, w, batch_size = (
        config.optimizer.learning_rate,
        config.optimizer.warmup_steps,
        config.dataset.batch_size,
    )
    fn = linear_warmup(lr, w)
    assert callable(fn)  # a ramp: the config warms up
    for n in (0, 1, 2, 1000, 2441, 2442, 5000):
        reference = lr * min(n * batch_size / (edm_paper.LR_RAMPUP_KIMG * 1000), 1)
        got = float(np.asarray(fn(np.int32(n))))
        # float32: the quotient and the product each round once (2⁻²⁴ relative), lr itself once.
        assert math.isclose(got, reference, rel_tol=3 * 2.0**-24, abs_tol=0.0), (n, got, reference)


def ema_weights(half_life: float, ramp_up: float, n: int, offset: int) -> np.ndarray:
    """The weight each of n updates' parameters has in the final EMA, float64: β_i =
    0.5^(1/min(H, r·(i − offset))) (a span of 0 gives β = 0, the reference's
    ``max(..., 1e-8)``), w_i = (1 − β_i) Π_{j>i} β_j, divided by 1 − Π β (dew's debiasing; 1 for
    the reference, whose β_1 = 0)."""
    i = np.arange(1, n + 1, dtype=np.float64)
    span = np.minimum(half_life, ramp_up * (i - offset))
    log2_beta = np.where(span > 0, -1.0 / np.maximum(span, 1e-300), -np.inf)
    after = np.concatenate([np.cumsum(log2_beta[::-1])[::-1][1:], [0.0]])  # Σ_{j>i} log2 β_j
    weights = -np.expm1(log2_beta * np.log(2.0)) * np.exp2(after)
    return weights / -np.expm1(np.sum(log2_beta) * np.log(2.0))


@pytest.mark.parametrize("row", ["cifar10-cond-ddpmpp", "ffhq-ddpmpp", "imagenet64-cond-adm"])
def test_ema_differs_from_the_reference_only_in_the_documented_first_updates(row):
    """dew's β_n = 0.5^(1/min(H, r·n)) (``dew.averaging.ema``), the reference's uses r·(n−1)
    (``training_loop.py``: ``cur_nimg`` before the update). The final averages' weights differ
    only through the updates before both spans reach H (n ≤ H/r + 1), whose total weight is
    2^-(updates after them / H); the total-variation distance is bounded by that."""
    from dew.averaging.ema import spec_from_config

    config = resolve_config(load_config(f"{EXPERIMENT}:{row}"))
    h, r, n = config.ema.half_life, config.ema.ramp_up, config.train.num_steps
    spec = spec_from_config(config.ema)
    for k in (1, 2, 100, int(h / r), int(h / r) + 1, n):  # the law dew runs, in float32
        want = 0.5 ** (1 / min(h, r * k))
        assert math.isclose(float(spec.decay_at(k)), want, rel_tol=2 * 2.0**-24), (k, want)
    dew, reference = ema_weights(h, r, n, offset=0), ema_weights(h, r, n, offset=1)
    # Both are averages: the reference's because β_1 = 0 (its first update copies the weights),
    # dew's by the debiasing; n terms of float64 roundings, each relative 2⁻⁵³, bound the sums.
    for weights in (dew, reference):
        assert abs(weights.sum() - 1) <= 2 * n * 2.0**-53
    distance = 0.5 * np.abs(dew - reference).sum()
    ramp_end = math.floor(h / r) + 1
    bound = 2.0 ** (-(n - ramp_end) / h)
    assert 0 < distance <= bound, (distance, bound)
