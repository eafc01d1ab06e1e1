"""EDM2 (Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion Models"):
one preset per NVlabs/edm2 ``train_edm2.py`` ``config_presets`` entry, plus ``digits`` (CPU scale).

    python -m dew.main --config=experiments/edm2.py:img64-s --workdir=runs/edm2-img64-s \
        --config.dataset.path=datasets/img64.zip
    python -m dew.main --config=experiments/edm2.py:digits --workdir=runs/edm2-digits

Each reference preset resolves to exactly the reference's settings (``tests/test_edm2_presets.py``
checks them against ``third_party/edm2/presets.json``, which the reference's own
``setup_training_config`` produced): the network (``Precond``, ``model_channels``, ``dropout``,
``use_fp16``), the loss (``EDM2Loss`` ``P_mean``, ``P_std``, σ_data 0.5), Adam (β = (0.9, 0.99),
ε 1e-8), the inverse-square-root learning rate (``ref_lr``, ``ref_batches``, 10 Mimg ramp-up), the
batch (2048 images per update), the duration (``total_nimg`` / batch updates), the power-function
EMA profiles σ_rel 0.050 and 0.100 snapshotted every 8 Mi images (the reference's
``snapshot_nimg``), the seed 0. No label dropout: EDM2 trains a separate unconditional network for
guidance.

Data: the ``img64`` presets read an NVlabs/edm-format ImageNet-64 zip (``image_folder``, labels on,
uint8 -> [-1, 1] as the reference's ``StandardRGBEncoder``). The ``img512`` presets train in the
latent space of Stable Diffusion's VAE as the reference's ``StabilityVAEEncoder`` does
(``config.objective.latent``, ``dew.objectives.latent_space``: sd-vae-ft-mse, raw mean
(5.81, 3.25, 0.12, −2.15), raw std (4.17, 4.62, 3.71, 3.28), final mean 0 and std 0.5): the data is
a pre-encoded latent data set (``latent_dataset``: 64×64×8 raw mean ‖ std per 512×512 image), made
once, as the reference's ``dataset_tool.py convert --resolution=512x512
--transform=center-crop-dhariwal`` then ``dataset_tool.py encode`` make it, by

    python -m dew.data.sources.latent_dataset --source=<ImageNet train folder> \
        --dest=datasets/img512-sd --resolution=512x512 --transform=center-crop-dhariwal
    python -m dew.main --config=experiments/edm2.py:img512-s --workdir=runs/edm2-img512-s \
        --config.dataset.path=datasets/img512-sd

Training draws each step's latents from the stored mean and std; previews, ``dew.pipeline``,
``python -m dew.sample`` and ``python -m dew.fid --workdir`` decode through the VAE to 512×512
images, as the reference's ``generate_images.py`` does. The VAE weights are sd-vae-ft-mse's
``diffusion_pytorch_model.safetensors`` at ``config.objective.latent.weights`` ('' = the default
path, ``dew.networks.sd_vae_weights``); a missing file is one line naming it and how to get it.
"""

from ml_collections import ConfigDict

# train_edm2.py config_presets: (duration in images, batch, channels, lr, decay, dropout, P_mean, P_std)
PRESETS = {
    "img512-xxs": (2048 << 20, 2048, 64, 0.0170, 70000, 0.00, -0.4, 1.0),
    "img512-xs": (2048 << 20, 2048, 128, 0.0120, 70000, 0.00, -0.4, 1.0),
    "img512-s": (2048 << 20, 2048, 192, 0.0100, 70000, 0.00, -0.4, 1.0),
    "img512-m": (2048 << 20, 2048, 256, 0.0090, 70000, 0.10, -0.4, 1.0),
    "img512-l": (1792 << 20, 2048, 320, 0.0080, 70000, 0.10, -0.4, 1.0),
    "img512-xl": (1280 << 20, 2048, 384, 0.0070, 70000, 0.10, -0.4, 1.0),
    "img512-xxl": (896 << 20, 2048, 448, 0.0065, 70000, 0.10, -0.4, 1.0),
    "img64-xs": (1024 << 20, 2048, 128, 0.0120, 35000, 0.00, -0.8, 1.6),
    "img64-s": (1024 << 20, 2048, 192, 0.0100, 35000, 0.00, -0.8, 1.6),
    "img64-m": (2048 << 20, 2048, 256, 0.0090, 35000, 0.10, -0.8, 1.6),
    "img64-l": (1024 << 20, 2048, 320, 0.0080, 35000, 0.10, -0.8, 1.6),
    "img64-xl": (640 << 20, 2048, 384, 0.0070, 35000, 0.10, -0.8, 1.6),
}
SNAPSHOT_NIMG = 8 << 20
"""The reference's ``--snapshot`` default: power-EMA snapshots every 8 Mi images."""
EMA_STDS = (0.050, 0.100)
"""``training.phema.PowerFunctionEMA``'s default ``stds``."""
STABILITY_VAE_ENCODER = {
    "encoder": "stability_vae",
    "weights": "",  # '': dew.networks.sd_vae_weights.default_path()
    "vae_channels": (128, 256, 512, 512),
    "vae_layers_per_block": 2,
    "vae_groups": 32,
    "vae_latent_channels": 4,
}
"""``config.objective.latent`` of the img512 presets: ``training.encoders.StabilityVAEEncoder()``
with its defaults (sd-vae-ft-mse's ``AutoencoderKL`` shape; the latent scaling is
``dew.encoding.stability_vae.EDM2_SCALING``, the encoder's own raw/final mean and std)."""


def _common(config: ConfigDict) -> None:
    config.seed = 0
    config.objective = ConfigDict(
        {
            "name": "edm2",
            "preset": "EDM",
            "condition": "class_label",
            "condition_dropout": 0.0,
            "P_mean": -0.4,
            "P_std": 1.0,
            "sigma_data": 0.5,
            "sampling": {
                "steps": 32,
                "solver": "heun",
                "per_class": 10,
                "guidance": 1.0,
                "guidance_interval": (),
            },
        }
    )
    config.optimizer = ConfigDict(
        {
            "learning_rate": 0.0100,
            "schedule": "inverse_sqrt",
            "ref_batches": 70000.0,
            "rampup_Mimg": 10.0,
            "warmup_steps": 0,
            "b1": 0.9,
            "b2": 0.99,
            "grad_clip": 0.0,
        }
    )
    config.ema = ConfigDict({"power_std_rels": EMA_STDS, "snapshot_every": 0})


def reference_preset(name: str) -> ConfigDict:
    duration, batch, channels, lr, decay, dropout, p_mean, p_std = PRESETS[name]
    config = ConfigDict()
    _common(config)
    if name.startswith("img512"):
        config.dataset = ConfigDict(
            {"name": "latent_dataset", "batch_size": batch, "path": "", "use_labels": True, "cache": False}
        )
        config.objective.latent = ConfigDict(dict(STABILITY_VAE_ENCODER))
    else:
        config.dataset = ConfigDict(
            {"name": "image_folder", "batch_size": batch, "path": "", "use_labels": True, "cache": False}
        )
    config.objective.P_mean, config.objective.P_std = p_mean, p_std
    config.model = ConfigDict(
        {"name": "edm2", "model_channels": channels, "dropout": dropout, "use_fp16": True, "sigma_data": 0.5}
    )
    config.optimizer.learning_rate, config.optimizer.ref_batches = lr, float(decay)
    config.train = ConfigDict({"num_steps": duration // batch, "log_every": 128 << 10 >> 11})
    config.ema.snapshot_every = SNAPSHOT_NIMG // batch
    config.checkpoint = ConfigDict({"every": (128 << 20) // batch})
    config.eval = ConfigDict({"every": 0})
    config.preview = ConfigDict({"every": 0})
    return config


def digits() -> ConfigDict:
    """EDM2's recipe on scikit-learn's 8x8 digits at CPU scale (a 0.4 M-parameter network)."""
    config = ConfigDict()
    _common(config)
    config.dataset = ConfigDict({"name": "digits", "batch_size": 64})
    config.model = ConfigDict(
        {
            "name": "edm2",
            "model_channels": 32,
            "channel_mult": (1, 2),
            "num_blocks": 2,
            "attn_resolutions": (4,),
            "channels_per_head": 32,
            "logvar_channels": 32,
            "dropout": 0.0,
            "use_fp16": False,
        }
    )
    # ImageNet's 10 Mimg ramp-up and 70k-update decay are far beyond a 4,000-update run: ramp
    # over the first ~150 updates, decay after 1,000.
    config.optimizer.learning_rate, config.optimizer.ref_batches = 0.01, 1000.0
    config.optimizer.rampup_Mimg = 0.01
    config.train = ConfigDict({"num_steps": 4000, "log_every": 50})
    config.ema.snapshot_every = 250
    config.checkpoint = ConfigDict({"every": 500})
    config.eval = ConfigDict({"every": 1000, "num_batches": 2})
    config.preview = ConfigDict({"every": 1000, "metrics": ("digits_class_accuracy",)})
    return config


def get_config(arg: str | None = None) -> ConfigDict:
    """``arg``: a ``train_edm2.py`` preset without its ``edm2-`` prefix (``img512-xs`` ...
    ``img512-xxl``, ``img64-xs`` ... ``img64-xl``), or ``digits`` (the default)."""
    arg = arg or "digits"
    if arg == "digits":
        return digits()
    name = arg.removeprefix("edm2-")
    if name not in PRESETS:
        raise ValueError(f"experiments/edm2.py:{arg} is unknown: expected one of {['digits', *PRESETS]}")
    return reference_preset(name)
