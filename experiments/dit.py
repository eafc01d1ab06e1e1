"""DiT (Peebles & Xie 2023) on ImageNet-256 latents: facebookresearch/DiT's ``train.py``.

    python -m dew.main --config=experiments/dit.py:DiT-XL/2 --workdir=runs/dit-xl2 \
        --config.dataset.path=datasets/imagenet256-sd
    python -m dew.sample --workdir=runs/dit-xl2 --cfg_scale=4.0 --classes="(207,360,387,974,88,979,417,279)"
    python -m dew.fid --workdir=runs/dit-xl2 --num_samples=50000 ...   # cfg 1.5, 250 DDPM steps

Every size the reference's ``DiT_models`` names (``DiT-S/8`` … ``DiT-XL/2``) resolves to what its
``train.py`` resolves (``tests/test_dit_configs.py`` checks each against
``third_party/dit/configs.json``, which the reference's own argument parsing and constructors
produced: ``third_party/dit/make_configs.py``):

* the network: the registered ``DiT-<size>/<patch>`` (``dew.networks.dit``), 1,000 classes,
  label dropout 0.1 (CFG's null class), ``learn_sigma=True``, 32×32×4 latents (``--image-size
  256`` / 8);
* the objective: ``iddpm`` with ``create_diffusion(timestep_respacing="")``'s process (1,000
  linear β steps, ε prediction, learned-range variance, hybrid MSE + VLB loss), t uniform over
  the 1,000 steps;
* AdamW at lr 1e-4 with weight decay 0 (dew's Adam: identical with no decay; β = (0.9, 0.999),
  ε = 1e-8, torch's defaults), no warm-up, no clipping; batch 256 (``--global-batch-size``);
  1,400 epochs of ⌊1,281,167 / 256⌋ = 5,004 updates (the loader drops the last batch): 7,005,600
  updates (the paper's "7M steps"); checkpoints every 50,000 updates, logs every 100, seed 0;
* EMA 0.9999 per update. The reference starts its EMA as a copy of the initial weights
  (``update_ema(ema, model, decay=0)``); dew's EMA starts at zero and is debiased when read
  (``dew.averaging.ema``): after n updates the reference's EMA still holds β^n of θ_0 while
  dew's renormalises the same weights over θ_1 … θ_n. They differ only while β^n is not
  negligible (the first ~10⁴–10⁵ updates; β^(7·10⁶) = e⁻⁷⁰⁰);
* the latents: SD-VAE posterior samples × 0.18215 (``vae.encode(x).latent_dist.sample()
  .mul_(0.18215)``), drawn per step from the pre-encoded mean ‖ std (``latent_dataset``, made by
  ``python -m dew.data.sources.latent_dataset --transform=center-crop-dhariwal
  --resolution=256x256 --pixels=dit``: ADM's center crop, as ``center_crop_arr``), i.e. raw mean
  0 and raw std 0.5 / 0.18215 in ``config.objective.latent``, whose ``pixels="dit"`` says the
  VAE sees [−1, 1] images (``Normalize(0.5, 0.5)``) and decodes to uint8 as ``sample_ddp.py``
  (``vae.decode(x / 0.18215)``, then ``clamp(127.5·y + 128)``). The reference encodes with ``sd-vae-ft-ema``
  (``--vae ema``); its encoder is sd-vae-ft-mse's (the two differ only in the fine-tuned
  decoder), so training is the same with dew's pinned sd-vae-ft-mse file (``weights=""``); to
  decode with ft-ema's decoder as the published FID did, set
  ``--config.objective.latent.weights=<sd-vae-ft-ema's diffusion_pytorch_model.safetensors>
  --config.objective.latent.allow_unpinned=True``. Not reproduced: the reference's per-epoch
  random horizontal flip of the images before encoding (pre-encoded latents are not flipped);
* sampling (``dew.pipeline``, ``python -m dew.sample``, ``python -m dew.fid``): the published
  FID 2.27's ``sample_ddp.py`` defaults, 250 respaced DDPM steps at cfg scale 1.5 on the first 3
  channels (``forward_with_cfg``); ``--cfg_scale=4.0`` for the visuals of ``sample.py``. The
  reference draws each FID sample's class uniformly at random; ``dew.fid`` draws every class in
  turn (``per_class`` = 1: 1,000 images per draw).

The reference's ``train.py`` draws no samples while training; previews are off
(``config.preview.every = 0``).
"""

from __future__ import annotations

from ml_collections import ConfigDict

IMAGENET_TRAIN = 1_281_167
SD_SCALE = 0.18215  # train.py: .mul_(0.18215)
LATENT = {
    "encoder": "stability_vae",
    "weights": "",
    "raw_mean": (0.0, 0.0, 0.0, 0.0),
    "raw_std": (0.5 / SD_SCALE,) * 4,  # edm2's scale = 0.5 / raw_std = 0.18215, bias 0
    "pixels": "dit",  # latents of [-1, 1] images; decoded by sample_ddp.py's clamp(127.5x + 128)
}
SIZES = tuple(f"{size}/{patch}" for size in ("S", "B", "L", "XL") for patch in (2, 4, 8))
BATCH, EPOCHS = 256, 1400  # --global-batch-size, --epochs
FID_SAMPLING = {"steps": 250, "cfg_scale": 1.5, "cfg_channels": 3, "method": "ddpm", "per_class": 1}


def training(config: ConfigDict, batch: int, epochs: int) -> None:
    """The training settings DiT's and SiT's train.py share (module docstring)."""
    config.seed = 0  # --global-seed
    config.dataset = ConfigDict(
        {"name": "latent_dataset", "batch_size": batch, "path": "", "use_labels": True, "cache": False}
    )
    config.optimizer = ConfigDict(
        {"learning_rate": 1e-4, "warmup_steps": 0.0, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "grad_clip": 0.0}
    )
    config.ema = ConfigDict({"decay": 0.9999})
    config.train = ConfigDict({"num_steps": epochs * (IMAGENET_TRAIN // batch), "log_every": 100})
    # --ckpt-every; train.py keeps every checkpoint it saves (and ranks none)
    config.checkpoint = ConfigDict({"every": 50_000, "keep": None, "keep_best": False})
    config.eval = ConfigDict({"every": 0})


def network(name: str) -> ConfigDict:
    """The registered ``name`` (``DiT-XL/2``, ``SiT-XL/2``, ...) at 1,000 classes, label dropout
    0.1, learned sigma, on 32×32 latents."""
    return ConfigDict(
        {
            "name": name,
            "num_classes": 1000,
            "class_dropout_prob": 0.1,
            "learn_sigma": True,
            "input_size": 32,
        }
    )


def get_config(arg: str | None = None) -> ConfigDict:
    """``arg``: a size as the reference names it, ``DiT-XL/2`` by default (train.py's), or
    ``digits`` (``digits``: the CPU-scale run)."""
    arg = arg or "DiT-XL/2"
    if arg == "digits":
        objective = ConfigDict(
            {
                "name": "iddpm",
                "learn_sigma": True,
                "condition": "class_label",
                "sampling": {"steps": 50, "cfg_scale": 1.0, "method": "ddpm", "per_class": 10},
            }
        )
        config = digits(objective, "dit")
        config.model.learn_sigma = True
        return config
    size = arg.removeprefix("DiT-")
    if size not in SIZES:
        raise ValueError(
            f"experiments/dit.py:{arg} is unknown: expected one of {[f'DiT-{s}' for s in SIZES]}"
        )
    config = ConfigDict()
    training(config, BATCH, EPOCHS)
    config.objective = ConfigDict(
        {
            "name": "iddpm",
            "noise_schedule": "linear",
            "diffusion_steps": 1000,
            "learn_sigma": True,
            "sigma_small": False,
            "predict_xstart": False,
            "use_kl": False,
            "rescale_learned_sigmas": False,
            "condition": "class_label",
            "latent": dict(LATENT),
            "sampling": dict(FID_SAMPLING),
        }
    )
    config.model = network(f"DiT-{size}")
    config.preview = ConfigDict({"every": 0})
    return config


def digits(objective: ConfigDict, model: str) -> ConfigDict:
    """A CPU-scale run of the same recipe on the 8×8 digits in pixel space: a 4-block, 128-wide,
    4-head transformer on 2×2 patches (16 tokens), label dropout 0.1 for guidance, AdamW at
    1e-3 (a small network learns faster at a higher rate than the reference's 1e-4), EMA 0.999."""
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "digits", "batch_size": 64})
    config.objective = objective
    config.model = ConfigDict(
        {
            "name": model,
            "depth": 4,
            "hidden_size": 128,
            "num_heads": 4,
            "patch_size": 2,
            "input_size": 8,
            "num_classes": 10,
            "class_dropout_prob": 0.1,
        }
    )
    config.optimizer = ConfigDict({"learning_rate": 1e-3, "warmup_steps": 0, "b2": 0.999})
    config.ema = ConfigDict({"decay": 0.999})
    config.train = ConfigDict({"num_steps": 4000, "log_every": 50})
    config.checkpoint = ConfigDict({"every": 500})
    config.eval = ConfigDict({"every": 1000, "num_batches": 2})
    config.preview = ConfigDict({"every": 1000, "metrics": ("digits_class_accuracy",)})
    return config
