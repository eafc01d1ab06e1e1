"""MeanFlow (Geng et al. 2025) and improved MeanFlow (Lu et al. 2025): one-step generation.

    python -m dew.main --config=experiments/meanflow.py --workdir=runs/meanflow-digits
    python -m dew.main --config=experiments/meanflow.py:MF-B/4 --workdir=runs/mf-b4 \
        --config.dataset.path=datasets/imagenet256-sd
    python -m dew.main --config=experiments/meanflow.py:iMF-B/2 --workdir=runs/imf-b2 \
        --config.dataset.path=datasets/imagenet256-sd

``digits`` (the default) trains MeanFlow on scikit-learn's 8x8 digits with dew's U-Net given its
second time input h (CPU scale). The ImageNet-256 presets resolve to the references' own config
files (``tests/test_meanflow_configs.py`` checks them against ``third_party/meanflow/configs.json``
and ``third_party/imeanflow/configs.json``, which the references' ``configs/load_config.py``
produced):

* ``MF-B/4``: Gsunshine/meanflow ``configs/run_b4.yml`` over ``configs/default.py``, exactly
  (the repository's only preset file): DiT-B/4 with the second time embedding, logit-normal
  (−0.4, 1) (t, r), 75 % of rows with r = t, guidance folded in with ω = 1, κ = 0.5 on [0, 1],
  class dropout 0.1, adaptive weight p = 1, ε = 0.01; AdamW (β2 = 0.95, no weight decay) at
  1e-4 constant, batch 256, 240 epochs, EMA 0.9999, seed 42, 1-step sampling.
* ``MF-B/2``, ``MF-M/2``, ``MF-L/2``, ``MF-XL/2``: the same recipe with the network changed (the
  reference's ``DiT_B_2`` ... ``DiT_XL_2``). The paper's per-size settings (its Table 4: longer
  schedules and per-size guidance) are not in the reference's config files and are not
  reproduced here; set them with ``--config.objective.*`` / ``--config.train.num_steps``.
* ``iMF-B/2``: Lyy-iiis/imeanflow ``configs/train_config.yml`` over ``configs/default.py``,
  exactly: 50 % flow-matching rows, log-uniform ω on [1, 8] (cfg_beta 1), class dropout 0.1; AdamW
  (β2 = 0.95) at 1e-4 after a 10-epoch linear warm-up, batch 1024, 640 epochs, EMA 0.9999; previews
  at ω = 7.5 on [0.4, 0.65] (the training config's sampling); ``configs/eval_config.yml``'s
  ω = 8.0, [0.4, 0.65] is ``python -m dew.sample ... --omega=8.0``.
* ``iMF-M/2``, ``iMF-L/2``, ``iMF-XL/2``: the same with the network changed; sampling at the values
  ``eval_config.yml`` recommends for the released checkpoints (M, L: ω = 10.5 on [0.4, 0.6]; XL:
  ω = 8.0 on [0.42, 0.62]; XL 2-NFE: ω = 4.0 on [0.36, 0.64]).

Data: ImageNet-256 as SD-VAE latents (``latent_dataset``: raw mean ‖ std per image, made by
``python -m dew.data.sources.latent_dataset``), scaled as the references scale them
(latent · 0.18215, i.e. raw mean 0 and raw std 0.5 / 0.18215 in ``config.objective.latent``).
Epochs are optimizer steps here: ⌊1,281,167 / batch⌋ per epoch (the references' drop_last loader).
The MeanFlow networks are ``dew.networks.dit`` (``dit``) at the reference's ``DiT_*`` sizes with
its second time embedding (``time_inputs=("t", "h")``); iMF's are the registry names ``iMF-*``
(``dew.networks.dit`` with ``conditioning="in_context"`` and the v-head: Lyy-iiis/imeanflow's
``imfDiT_*_2``, checked against the reference's own network by
``tests/test_imeanflow_dit_parity.py``). dew's EMA is zero-initialised and debiased (the
references start theirs at the initial weights), which differs only in the first ~1/(1 − 0.9999)
steps.
"""

from __future__ import annotations

from ml_collections import ConfigDict

IMAGENET_TRAIN = 1_281_167
SD_SCALE = 0.18215  # the references' latent scaling (utils/vae_util.py)
LATENT = {
    "encoder": "stability_vae",
    "weights": "",
    "raw_mean": (0.0, 0.0, 0.0, 0.0),
    "raw_std": (0.5 / SD_SCALE,) * 4,
}
MF_SIZES = ("MF-B/4", "MF-B/2", "MF-M/2", "MF-L/2", "MF-XL/2")
# Gsunshine/meanflow models_dit.py: DiT_<size>_<patch> = (depth, hidden_size, num_heads, patch_size)
MF_NETWORKS = {
    "MF-B/4": (12, 768, 12, 4),
    "MF-B/2": (12, 768, 12, 2),
    "MF-M/2": (16, 1024, 16, 2),
    "MF-L/2": (24, 1024, 16, 2),
    "MF-XL/2": (28, 1152, 16, 2),
}
IMF_SIZES = ("iMF-B/2", "iMF-M/2", "iMF-L/2", "iMF-XL/2")
# eval_config.yml: (ω, t_min, t_max) recommended for the released checkpoints (1 NFE)
IMF_SAMPLING = {
    "iMF-B/2": (7.5, 0.4, 0.65),  # train_config.yml's sampling (previews during training)
    "iMF-M/2": (10.5, 0.4, 0.6),
    "iMF-L/2": (10.5, 0.4, 0.6),
    "iMF-XL/2": (8.0, 0.42, 0.62),
}


def _imagenet(batch: int) -> ConfigDict:
    return ConfigDict(
        {"name": "latent_dataset", "batch_size": batch, "path": "", "use_labels": True, "cache": False}
    )


def _training(config: ConfigDict, batch: int, epochs: int, warmup_epochs: int, seed: int) -> None:
    steps_per_epoch = IMAGENET_TRAIN // batch
    config.seed = seed
    config.optimizer = ConfigDict(
        {
            "learning_rate": 1e-4,
            "warmup_steps": float(warmup_epochs * steps_per_epoch),
            "b1": 0.9,
            "b2": 0.95,
            "eps": 1e-8,
            "grad_clip": 0.0,
        }
    )
    config.ema = ConfigDict({"decay": 0.9999})
    config.train = ConfigDict({"num_steps": epochs * steps_per_epoch, "log_every": 100})
    config.checkpoint = ConfigDict({"every": 10 * steps_per_epoch})
    config.eval = ConfigDict({"every": 0})
    config.preview = ConfigDict({"every": 10 * steps_per_epoch})


def meanflow_preset(size: str) -> ConfigDict:
    """run_b4.yml over default.py, with the network ``size``."""
    config = ConfigDict()
    config.dataset = _imagenet(256)
    config.objective = ConfigDict(
        {
            "name": "meanflow",
            "noise_dist": "logit_normal",
            "P_mean": -0.4,
            "P_std": 1.0,
            "data_proportion": 0.75,
            "class_dropout_prob": 0.1,
            "guidance_eq": "cfg",
            "omega": 1.0,
            "kappa": 0.5,
            "t_start": 0.0,
            "t_end": 1.0,
            "norm_p": 1.0,
            "norm_eps": 0.01,
            "condition": "class_label",
            "latent": dict(LATENT),
            "sampling": {"schedule": (1.0, 0.0), "per_class": 1},
        }
    )
    depth, hidden, heads, patch = MF_NETWORKS[size]
    # dew.networks.dit as the reference's MeanFlow builds its DiT: the h embedder, no label
    # dropout inside the network (the objective drops labels) but the null-class row, no learned
    # variance, 32x32 latents.
    config.model = ConfigDict(
        {
            "name": "dit",
            "depth": depth,
            "hidden_size": hidden,
            "num_heads": heads,
            "patch_size": patch,
            "mlp_ratio": 4.0,
            "class_dropout_prob": 0.0,
            "null_class": True,
            "learn_sigma": False,
            "num_classes": 1000,
            "input_size": 32,
            "time_inputs": ("t", "h"),
        }
    )
    _training(config, batch=256, epochs=240, warmup_epochs=0, seed=42)
    return config


def imeanflow_preset(size: str) -> ConfigDict:
    """train_config.yml over default.py, with the network ``size``."""
    omega, t_min, t_max = IMF_SAMPLING[size]
    config = ConfigDict()
    config.dataset = _imagenet(1024)
    config.objective = ConfigDict(
        {
            "name": "imeanflow",
            "P_mean": -0.4,
            "P_std": 1.0,
            "data_proportion": 0.5,
            "cfg_beta": 1.0,
            "class_dropout_prob": 0.1,
            "norm_p": 1.0,
            "norm_eps": 0.01,
            "condition": "class_label",
            "latent": dict(LATENT),
            "sampling": {
                "schedule": (1.0, 0.0),
                "per_class": 1,
                "omega": omega,
                "t_min": t_min,
                "t_max": t_max,
            },
        }
    )
    config.model = ConfigDict({"name": size})
    _training(config, batch=1024, epochs=640, warmup_epochs=10, seed=42)
    config.checkpoint.every = config.preview.every = 20 * (IMAGENET_TRAIN // 1024)
    return config


def digits() -> ConfigDict:
    """MeanFlow on the 8x8 digits with dew's U-Net and its second time input (CPU scale)."""
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "digits", "batch_size": 64})
    config.objective = ConfigDict(
        {
            "name": "meanflow",
            "noise_dist": "logit_normal",
            "P_mean": -0.4,
            "P_std": 1.0,
            "data_proportion": 0.75,
            "class_dropout_prob": 0.1,
            "guidance_eq": "cfg",
            "omega": 1.0,
            "kappa": 0.5,
            "t_start": 0.0,
            "t_end": 1.0,
            "norm_p": 1.0,
            "norm_eps": 0.01,
            "sampling": {"schedule": (1.0, 0.0), "per_class": 10},
        }
    )
    config.model = ConfigDict(
        {"name": "unet", "channels": 32, "channel_mult": (1, 2), "num_blocks": 2, "attn_resolutions": (4,)}
    )
    config.optimizer = ConfigDict({"learning_rate": 1e-3, "warmup_steps": 0, "b2": 0.95})
    config.ema = ConfigDict({"decay": 0.999})
    config.train = ConfigDict({"num_steps": 4000, "log_every": 50})
    config.checkpoint = ConfigDict({"every": 500})
    config.eval = ConfigDict({"every": 1000, "num_batches": 2})
    config.preview = ConfigDict({"every": 1000, "metrics": ("digits_class_accuracy",)})
    return config


def imf_digits() -> ConfigDict:
    """improved MeanFlow on the 8x8 digits (CPU scale): train_config.yml's loss with iMF's
    in-context network at 4 blocks (2 shared, 2 per head), 128 wide, 4 heads, in pixel space."""
    config = digits()
    config.objective = ConfigDict(
        {
            "name": "imeanflow",
            "P_mean": -0.4,
            "P_std": 1.0,
            "data_proportion": 0.5,
            "cfg_beta": 1.0,
            "class_dropout_prob": 0.1,
            "norm_p": 1.0,
            "norm_eps": 0.01,
            "condition": "class_label",
            "sampling": {"schedule": (1.0, 0.0), "per_class": 10, "omega": 1.0, "t_min": 0.0, "t_max": 1.0},
        }
    )
    config.model = ConfigDict(
        {
            "name": "imf_dit",
            "depth": 4,
            "head_depth": 2,
            "hidden_size": 128,
            "num_heads": 4,
            "input_size": 8,
            "num_classes": 10,
        }
    )
    return config


def get_config(arg: str | None = None) -> ConfigDict:
    """``arg``: ``digits`` (the default), ``iMF-digits``, one of ``MF_SIZES`` or ``IMF_SIZES``."""
    arg = arg or "digits"
    if arg == "digits":
        return digits()
    if arg == "iMF-digits":
        return imf_digits()
    if arg in MF_SIZES:
        return meanflow_preset(arg)
    if arg in IMF_SIZES:
        return imeanflow_preset(arg)
    raise ValueError(
        f"experiments/meanflow.py:{arg} is unknown: expected one of "
        f"{['digits', 'iMF-digits', *MF_SIZES, *IMF_SIZES]}"
    )
