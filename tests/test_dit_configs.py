"""``experiments/dit.py:<size>`` and ``experiments/sit.py:<size>`` against what the references'
own code resolves: ``third_party/dit/configs.json`` and ``third_party/sit/configs.json``, made by
``third_party/dit/make_configs.py`` from facebookresearch/DiT's and willisma/SiT's ``train.py``
and ``sample_ddp.py`` argument parsing, the constants their ``train.py`` hard-codes and their
model constructors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers_common import ROOT

from dew import registry
from dew.config import apply_overrides, load_config
from dew.diffusion.iddpm import GaussianDiffusion
from dew.diffusion.transport import Transport
from dew.training.trainer_config import resolve_config

DIT = json.loads((ROOT / "third_party" / "dit" / "configs.json").read_text())
SIT = json.loads((ROOT / "third_party" / "sit" / "configs.json").read_text())
IMAGENET_TRAIN = 1_281_167  # ImageNet-1k train images; the references' loaders drop the last batch
VAE_FACTOR = 8  # SD-VAE: 256 px -> 32 latents (train.py: latent_size = image_size // 8)


def resolved(experiment: str, name: str):
    return resolve_config(
        apply_overrides(load_config(str(ROOT / "experiments" / experiment) + f":{name}"), [])
    )


def check_shared_training(config, reference: dict, name: str) -> None:
    """What DiT's and SiT's train.py resolve alike."""
    args, literals, built = reference["train"][name], reference["literals"], reference["models"][name]
    # the network
    assert config.model.name == name and name in registry.models.names()
    for key in ("depth", "hidden_size", "num_heads", "patch_size", "learn_sigma", "class_dropout_prob"):
        assert config.model[key] == built[key], key
    assert config.model.num_classes == args["num_classes"] and config.model.mlp_ratio == 4.0
    assert config.model.input_size == args["image_size"] // VAE_FACTOR
    assert tuple(config.objective.latent.raw_mean) == (0.0,) * built["in_channels"]
    # the data, the schedule, the seed
    assert config.dataset.name == "latent_dataset" and config.dataset.use_labels
    assert config.dataset.batch_size == args["global_batch_size"]
    assert config.train.num_steps == args["epochs"] * (IMAGENET_TRAIN // args["global_batch_size"])
    assert config.train.log_every == args["log_every"] and config.checkpoint.every == args["ckpt_every"]
    assert config.checkpoint.keep is None  # train.py keeps every checkpoint it saves
    assert config.seed == args["global_seed"]
    # AdamW(lr=1e-4, weight_decay=0) with torch's other defaults: dew's Adam, no decay
    adamw = {**reference["AdamW_defaults"], **literals["AdamW"]}
    assert config.optimizer.learning_rate == adamw["lr"] and adamw["weight_decay"] == 0
    assert (config.optimizer.b1, config.optimizer.b2) == tuple(adamw["betas"])
    assert config.optimizer.eps == adamw["eps"] and not adamw["amsgrad"]
    assert config.optimizer.warmup_steps == 0 and config.optimizer.grad_clip == 0
    # EMA: update_ema's decay after every step; the reference starts it as a copy (decay=0),
    # dew at zero, debiased (experiments/dit.py's docstring)
    assert config.ema.decay == literals["update_ema_default_decay"] and config.ema.half_life == 0
    assert literals["update_ema_calls"] == [0, None]
    # latents: posterior sample * 0.18215 (edm2's scale = 0.5 / raw_std, bias 0)
    latent = config.objective.latent
    assert latent.encoder == "stability_vae" and args["vae"] == "ema"
    np.testing.assert_allclose(0.5 / np.asarray(latent.raw_std), literals["latent_scale"], rtol=1e-15)
    assert config.preview.every == 0


@pytest.mark.parametrize("name", sorted(DIT["train"]))
def test_dit_sizes_are_the_references_train_py(name):
    config = resolved("dit.py", name)
    check_shared_training(config, DIT, name)
    o = config.objective
    assert o.name == "iddpm" and o.condition == "class_label"
    # create_diffusion(timestep_respacing="") with its defaults, the process dew builds from them
    assert DIT["literals"]["create_diffusion"] == {"timestep_respacing": "''"}
    for key, value in DIT["create_diffusion_defaults"].items():
        assert o[key] == value, key
    made = GaussianDiffusion.create("", **DIT["create_diffusion_defaults"])
    assert made.num_timesteps == 1000 and made.var_type == "learned_range" and made.loss_type == "mse"
    # the published FID 2.27: sample_ddp.py's defaults
    sample = DIT["sample"]
    assert o.sampling.steps == sample["num_sampling_steps"] and o.sampling.cfg_scale == sample["cfg_scale"]
    assert o.sampling.method == "ddpm" and o.sampling.cfg_channels == 3 and sample["vae"] == "ema"


@pytest.mark.parametrize("name", sorted(SIT["train"]))
def test_sit_sizes_are_the_references_train_py(name):
    config = resolved("sit.py", name)
    check_shared_training(config, SIT, name)
    args, o = SIT["train"][name], config.objective
    assert o.name == "interpolant" and o.condition == "class_label"
    # SiT's forward returns the first C channels of its learn_sigma output
    assert config.model.sigma_output is False and o.learn_sigma is False
    # create_transport(args.path_type, args.prediction, args.loss_weight, args.train_eps, args.sample_eps)
    assert SIT["literals"]["create_transport"] == {
        "arg0": "args.path_type",
        "arg1": "args.prediction",
        "arg2": "args.loss_weight",
        "arg3": "args.train_eps",
        "arg4": "args.sample_eps",
    }
    assert (o.path, o.prediction, o.loss_weight) == (
        args["path_type"],
        args["prediction"],
        args["loss_weight"],
    )
    assert (o.train_eps, o.sample_eps) == (args["train_eps"], args["sample_eps"])
    transport = Transport.create(o.path, o.prediction, o.loss_weight, o.train_eps, o.sample_eps)
    made = SIT["sit_transport"]
    assert (transport.train_eps, transport.sample_eps) == (made["train_eps"], made["sample_eps"])
    # the published FID 2.06: sample_ddp.py SDE --cfg-scale 1.5 and its SDE defaults
    sample, s = SIT["sample"], o.sampling
    assert SIT["sample_argv"] == ["SDE", "--cfg-scale=1.5"]
    assert s.steps == sample["num_sampling_steps"] and s.cfg_scale == sample["cfg_scale"]
    assert s.cfg_channels == 3 and tuple(s.guidance_interval) == (0.0, 1.0) and sample["vae"] == "ema"
    sde = registry.samplers[s.sampler]
    assert (sde.method, sde.diffusion_form, sde.diffusion_norm) == (
        sample["sampling_method"],
        sample["diffusion_form"],
        sample["diffusion_norm"],
    )
    assert (sde.last_step, sde.last_step_size) == (sample["last_step"], sample["last_step_size"])
    assert (sample["path_type"], sample["prediction"], sample["loss_weight"]) == (o.path, o.prediction, None)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("dit.py:DiT-XXL/2", "experiments/dit.py:DiT-XXL/2 is unknown"),
        ("sit.py:SiT-B/3", "SiT-B/3 is unknown"),
    ],
)
def test_an_unknown_size_is_one_line(arg, message):
    with pytest.raises(Exception) as e:
        load_config(str(ROOT / "experiments" / arg))
    assert message in str(e.value) and "\n" not in str(e.value).strip()
