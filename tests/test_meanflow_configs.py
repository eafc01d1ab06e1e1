"""``experiments/meanflow.py``'s presets against the references' own config files, as the
references' ``configs/load_config.py`` builds them (third_party/meanflow/configs.json,
third_party/imeanflow/configs.json; made by third_party/meanflow/extract_configs.py)."""

from __future__ import annotations

import json

import pytest
from helpers_common import ROOT

from dew import registry
from dew.config import load_config

EXPERIMENT = str(ROOT / "experiments" / "meanflow.py")
IMAGENET_TRAIN = 1_281_167  # ImageNet-1k train images; the references' loaders drop the last batch
MF = json.loads((ROOT / "third_party" / "meanflow" / "configs.json").read_text())["run_b4"]
IMF = json.loads((ROOT / "third_party" / "imeanflow" / "configs.json").read_text())
# The references' network names -> dew's registry names
MF_NETWORKS = {"DiT_B_4": {"depth": 12, "hidden_size": 768, "num_heads": 12, "patch_size": 4}}
IMF_NETWORKS = {"imfDiT_B_2": "iMF-B/2"}


def common_training(config, training: dict) -> None:
    steps_per_epoch = IMAGENET_TRAIN // training["batch_size"]
    assert config.dataset.batch_size == training["batch_size"]
    assert config.optimizer.learning_rate == training["learning_rate"]
    assert config.optimizer.b2 == training["adam_b2"]
    assert (config.optimizer.b1, config.optimizer.eps) == (0.9, 1e-8)  # optax.adamw's defaults
    assert config.optimizer.warmup_steps == training.get("warmup_epochs", 0) * steps_per_epoch
    assert training["ema_type"] == "const" and config.ema.decay == training["ema_val"]
    assert config.train.num_steps == training["num_epochs"] * steps_per_epoch
    assert config.seed == training["seed"]
    assert not training["half_precision"] and "precision" not in config  # float32


def test_mf_b4_is_the_references_run_b4():
    config = load_config(f"{EXPERIMENT}:MF-B/4")
    o = config.objective
    for key, value in MF["method"].items():
        assert o[key] == value, key
    # models_dit.DiT_B_4 as MeanFlow.setup builds it: class_dropout_prob=0, learn_sigma False,
    # the null-class row, the h embedder
    assert config.model.name == "dit"
    for key, value in MF_NETWORKS[MF["model"]["cls"]].items():
        assert config.model[key] == value, key
    assert (config.model.class_dropout_prob, config.model.learn_sigma, config.model.null_class) == (
        0.0,
        False,
        True,
    )
    assert tuple(config.model.time_inputs) == ("t", "h") and config.model.mlp_ratio == 4.0
    common_training(config, MF["training"])
    # sampling: num_steps 1 on the default schedule [1, 0]
    assert MF["sampling"]["num_steps"] == 1 and MF["sampling"]["sampling_timesteps"] is None
    assert tuple(o.sampling.schedule) == (1.0, 0.0)
    assert (MF["dataset"]["image_size"], MF["dataset"]["image_channels"]) == (32, 4)  # SD-VAE latents
    assert MF["dataset"]["vae"] == "mse" and o.latent.encoder == "stability_vae"


def test_imf_b2_is_the_references_train_config():
    config = load_config(f"{EXPERIMENT}:iMF-B/2")
    o, train = config.objective, IMF["train"]
    for key, value in train["model"].items():
        if key == "model_str":
            assert config.model.name == IMF_NETWORKS[value]
        elif key != "num_classes":
            assert o[key] == value, key
    assert train["training"]["lr_schedule"] == "warmup_const"
    common_training(config, train["training"])
    s = train["sampling"]
    assert tuple(o.sampling.schedule) == tuple(1.0 - i / s["num_steps"] for i in range(s["num_steps"] + 1))
    assert (o.sampling.omega, o.sampling.t_min, o.sampling.t_max) == (s["omega"], s["t_min"], s["t_max"])
    evaluation = IMF["eval"]["sampling"]
    assert evaluation["interval"] == [[0.4, 0.65]] and evaluation["omegas"] == [8.0]


@pytest.mark.parametrize(
    "size", ["MF-B/4", "MF-B/2", "MF-M/2", "MF-L/2", "MF-XL/2", "iMF-B/2", "iMF-M/2", "iMF-L/2", "iMF-XL/2"]
)
def test_each_preset_resolves_against_the_schema(size):
    from dew.training.trainer_config import resolve_config

    config = load_config(f"{EXPERIMENT}:{size}")
    if config.model.name not in registry.models:
        pytest.skip(f"the network {config.model.name!r} is not registered in this checkout")
    resolve_config(config)


def test_the_digits_preset_resolves():
    from dew.training.trainer_config import resolve_config

    config = resolve_config(load_config(EXPERIMENT))
    assert config.objective.name == "meanflow" and config.model.name == "unet"
