"""``experiments/edm2.py:<preset>`` resolves to exactly the settings NVlabs/edm2's own
``train_edm2.py`` resolves for that preset (``third_party/edm2/presets.json``, made by
``third_party/edm2/make_presets.py`` with the reference's click command and
``setup_training_config``), field by field."""

from __future__ import annotations

import json
import os

import pytest

from dew.config import load_config
from dew.training.trainer_config import resolve_config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
with open(os.path.join(ROOT, "third_party", "edm2", "presets.json")) as f:
    REFERENCE = json.load(f)

NOT_COMPARED = {
    "batch_gpu": "per-GPU micro-batch: a device-memory choice; dew's is train.accumulation, and "
    "the images per update (batch_size) are compared",
    "cudnn_benchmark": "a cuDNN autotuning switch with no dew counterpart (XLA autotunes itself)",
    "encoder_kwargs.class_name": "compared where dew has the counterpart: img64's StandardRGBEncoder "
    "= image_folder's scaling to [-1, 1], img512's StabilityVAEEncoder = objective.latent.encoder "
    "'stability_vae'",
}


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _as_reference(c, preset: str) -> dict:
    """The resolved dew config in the reference's terms (``setup_training_config``'s keys, plus
    the callee defaults ``make_presets.py`` records)."""
    images_per_update = c.dataset.batch_size * c.train.accumulation
    dew = {
        # edm2's ImageFolderDataset reads PNGs and pre-encoded .npy latents; dew has a source each
        "dataset_kwargs.class_name": {
            "image_folder": "training.dataset.ImageFolderDataset",
            "latent_dataset": "training.dataset.ImageFolderDataset",
        }.get(c.dataset.name),
        "dataset_kwargs.use_labels": c.dataset.use_labels and c.objective.condition == "class_label",
        "total_nimg": c.train.num_steps * c.dataset.batch_size,
        "batch_size": images_per_update,
        "network_kwargs.class_name": {"edm2": "training.networks_edm2.Precond"}.get(c.model.name),
        "network_kwargs.model_channels": c.model.model_channels,
        "network_kwargs.dropout": c.model.dropout,
        "network_kwargs.use_fp16": c.model.use_fp16,
        "loss_kwargs.class_name": {"edm2": "training.training_loop.EDM2Loss"}.get(c.objective.name),
        "loss_kwargs.P_mean": c.objective.P_mean,
        "loss_kwargs.P_std": c.objective.P_std,
        "lr_kwargs.func_name": {"inverse_sqrt": "training.training_loop.learning_rate_schedule"}.get(
            c.optimizer.schedule
        ),
        "lr_kwargs.ref_lr": c.optimizer.learning_rate,
        "lr_kwargs.ref_batches": c.optimizer.ref_batches,
        "loss_scaling": 1.0,  # dew's loss is not scaled
        "status_nimg": c.train.log_every * images_per_update,
        "snapshot_nimg": c.ema.snapshot_every * images_per_update,
        "checkpoint_nimg": c.checkpoint.every * images_per_update,
        "seed": c.seed,
        # Callee defaults.
        "defaults.optimizer_kwargs.class_name": "torch.optim.Adam" if c.optimizer.grad_clip == 0 else None,
        "defaults.optimizer_kwargs.betas": [c.optimizer.b1, c.optimizer.b2],
        "defaults.ema_kwargs.class_name": "training.phema.PowerFunctionEMA",
        "defaults.ema_stds": list(c.ema.power_std_rels),
        "defaults.loss_sigma_data": c.objective.sigma_data,
        "defaults.rampup_Mimg": c.optimizer.rampup_Mimg,
        "defaults.network_sigma_data": c.model.sigma_data,
    }
    if c.dataset.name == "image_folder" and preset.startswith("edm2-img64"):
        dew["encoder_kwargs.class_name"] = "training.encoders.StandardRGBEncoder"
    latent = c.objective.get("latent")
    if c.dataset.name == "latent_dataset" and latent is not None and latent.encoder == "stability_vae":
        dew["encoder_kwargs.class_name"] = "training.encoders.StabilityVAEEncoder"
    # EDM2's recipe: no label dropout, no warm-up beyond rampup_Mimg, power-EMA only.
    assert c.objective.condition_dropout == 0.0 and c.optimizer.warmup_steps == 0
    return dew


@pytest.mark.parametrize("preset", sorted(REFERENCE["presets"]))
def test_preset_resolves_to_the_reference_settings(preset):
    config = resolve_config(
        load_config(os.path.join(ROOT, f"experiments/edm2.py:{preset.removeprefix('edm2-')}"))
    )
    want = _flatten(REFERENCE["presets"][preset])
    want.update(_flatten(REFERENCE["defaults"], "defaults."))
    got = _as_reference(config, preset)
    for field in sorted(want):
        if field in NOT_COMPARED and not (field == "encoder_kwargs.class_name" and field in got):
            continue
        assert field in got, f"{preset}: reference field {field} has no dew counterpart in the test"
        assert got[field] == want[field], (
            f"{preset}: {field} is {got[field]!r} in dew, {want[field]!r} in the reference"
        )
    assert not set(got) - set(want), f"{preset}: dew fields unknown to the reference: {set(got) - set(want)}"


def test_unknown_preset_names_the_choices():
    with pytest.raises(Exception, match="img512-xs"):
        load_config(os.path.join(ROOT, "experiments/edm2.py:img512-q"))
