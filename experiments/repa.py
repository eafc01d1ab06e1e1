"""REPA (Yu et al. 2025): SiT trained with representation alignment to a frozen encoder.

    python -m dew.main --config=experiments/repa.py:SiT-XL/2 --workdir=runs/repa-xl2 \
        --config.dataset.path=datasets/in256/vae-sd --config.dataset.images=datasets/in256/images \
        --config.objective.repa.allow_unpinned=True
    python experiments/repa_digits.py export --probe=runs/probe --out=runs/probe-encoder.npz
    python -m dew.main --config=experiments/repa.py:digits --workdir=runs/repa-digits \
        --config.objective.repa.encoder_weights=runs/probe-encoder.npz
    python -m dew.main --config=experiments/repa.py:digits-baseline --workdir=runs/sit-digits

``SiT-B/2``, ``SiT-L/2``, ``SiT-XL/2`` (REPA's ``--model`` choices) resolve to what
sihyun-yu/REPA's ``train.py`` ``parse_args`` resolves for the README's training command
(``tests/test_repa.py`` checks them against ``third_party/repa/args.json``, which that parser
produced): AdamW (β = 0.9, 0.999, ε = 1e-8, no weight decay) at a constant 1e-4, global-norm
clipping at 1.0 (``--max-grad-norm``), batch 256, EMA 0.9999, seed 0, class dropout 0.1
(``--cfg-prob``, in the network's label embedder as REPA's ``SiT(use_cfg=True)``), the
``linear`` path with ``v`` prediction and ``uniform`` weighting (dew's SiT ``Linear`` /
``velocity``, time mirrored: ``dew.objectives.repa``), REPA at ``--proj-coeff=0.5``,
``--encoder-depth=8``, ``--enc-type=dinov2-vit-b`` (``dinov2-vit-b``: ViT-B/14 at 224, 256
tokens = SiT/2's 16×16 at 32×32 latents), projector width 2048 (``models/sit.py``'s
``projector_dim``), ``--max-train-steps=400000`` (the parser's default; the published 1.42
checkpoint trained 4M steps: ``--config.train.num_steps=4000000``).

The sampling behind the published FID (README's ``generate.py`` command: ``--mode=sde
--num-steps=250 --cfg-scale=1.8 --guidance-high=0.7``, recorded as ``REPA_SAMPLING``) is REPA's
own ``euler_maruyama_sampler``, dew's registered ``repa_sde`` (``dew.sampling.repa_sampler``:
t from 1 to 0.04 in 250 steps, diffusion 2t, a last deterministic step to 0), guiding all 4
latent channels on REPA's t ∈ [0, 0.7], i.e. SiT time [0.3, 1] (``guidance_interval``); the
presets' ``config.objective.sampling`` is that, for previews, ``dew.pipeline``, ``python -m
dew.sample`` and ``python -m dew.fid``. ``generate.py``'s ODE is ``--sampler=repa_ode``
(``repa_ode_heun`` with ``--heun``).

Data: REPA's loader (``dataset.py``) yields the raw uint8 image (the encoder's input) beside
the SD-VAE posterior (``sd-vae-ft-mse``; ``train.py``'s ``sample_posterior`` draws mean + ε·std
×0.18215 each step). The ImageNet presets read both from one ``latent_dataset`` source: the
latents (``config.dataset.path``: REPA's ``vae-sd/``, edm2's ``encode`` layout) as the sample,
drawn and scaled by ``config.objective.latent`` (sd-vae-ft-mse, 0.18215, as
``experiments/sit.py``; ``pixels="repa"``: REPA's encoder sees pixels / 127.5 − 1 and
``generate.py`` writes ``clamp(255·(y + 1)/2)`` truncated), and the ADM-center-cropped 256²
images (``config.dataset.images``: REPA's ``images/``) as the field ``pixels`` the encoder sees
(``config.objective.repa.image_field="pixels"``). dew's own encoder writes both:

    python -m dew.data.sources.latent_dataset --source=<ImageNet train> --dest=datasets/in256/vae-sd \
        --transform=center-crop-dhariwal --resolution=256x256 --images_dest=datasets/in256/images \
        --pixels=repa
    python -m dew.main --config=experiments/repa.py:SiT-XL/2 --workdir=runs/repa-xl2 \
        --config.dataset.path=datasets/in256/vae-sd --config.dataset.images=datasets/in256/images

``digits`` / ``digits-baseline``: the CPU-scale comparison (experiments/RESULTS.md): a small
SiT (depth 4, width 128, patch 4: 2×2 tokens) on the 8×8 digits in pixel space, with and without
REPA aligned to dew's own contrastive encoder (``experiments/probe.py``'s ``image_encoder``, its
last conv map: 2×2 tokens of 64 features), same seed and settings otherwise.
"""

from __future__ import annotations

from ml_collections import ConfigDict

IMAGENET_SIZES = ("SiT-B/2", "SiT-L/2", "SiT-XL/2")
# train.py: sd-vae-ft-mse latents (edm2's stability_vae codec), latents_scale 0.18215, bias 0
# preprocessing/encoders.py encodes pixels / 127.5 - 1; generate.py's uint8 is clamp(255 (x + 1) / 2)
LATENT = {
    "encoder": "stability_vae",
    "weights": "",
    "raw_mean": (0.0,) * 4,
    "raw_std": (0.5 / 0.18215,) * 4,
    "pixels": "repa",
}
# README's generate.py command (the 1.42 FID): REPA's samplers.euler_maruyama_sampler
REPA_SAMPLING = {"mode": "sde", "num_steps": 250, "cfg_scale": 1.8, "guidance_low": 0.0, "guidance_high": 0.7}


def sampling(generate: dict) -> dict:
    """``config.objective.sampling`` for ``generate.py``'s ``--mode``/``--num-steps``/
    ``--cfg-scale``/``--guidance-low``/``--guidance-high``: REPA's sampler, guidance on every
    latent channel (4), REPA's interval [low, high] in SiT's time [1 − high, 1 − low]."""
    return {
        "sampler": f"repa_{generate['mode']}",
        "steps": generate["num_steps"],
        "per_class": 1,
        "cfg_scale": generate["cfg_scale"],
        "cfg_channels": 4,
        "guidance_interval": (1.0 - generate["guidance_high"], 1.0 - generate["guidance_low"]),
    }


def imagenet(size: str) -> ConfigDict:
    """REPA's ``train.py`` defaults with the README's command, for ``--model=size``."""
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict(
        {
            "name": "latent_dataset",
            "batch_size": 256,
            "path": "",
            "images": "",
            "use_labels": True,
            "cache": False,
        }
    )
    config.objective = ConfigDict(
        {
            "name": "interpolant",
            "path": "Linear",
            "prediction": "velocity",
            "loss_weight": None,
            "condition": "class_label",
            "learn_sigma": False,
            "repa": {
                "encoder": "dinov2-vit-b",
                "image_field": "pixels",
                "value_range": (0.0, 255.0),
                "resolution": 256,
                "encoder_depth": 8,
                "proj_coeff": 0.5,
                "projector_dim": 2048,
            },
            "latent": dict(LATENT),
            "sampling": sampling(REPA_SAMPLING),
        }
    )
    # REPA's SiT (models/sit.py): out_channels = in_channels (no variance channels, so its
    # checkpoints' final layer holds 4); use_cfg -> dropout 0.1
    config.model = ConfigDict(
        {
            "name": size,
            "input_size": 32,
            "num_classes": 1000,
            "class_dropout_prob": 0.1,
            "learn_sigma": False,
        }
    )
    config.optimizer = ConfigDict(
        {"learning_rate": 1e-4, "warmup_steps": 0, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "grad_clip": 1.0}
    )
    config.ema = ConfigDict({"decay": 0.9999})
    config.train = ConfigDict({"num_steps": 400_000, "log_every": 100})
    config.checkpoint = ConfigDict({"every": 50_000})
    config.eval = ConfigDict({"every": 0})
    config.preview = ConfigDict({"every": 10_000})
    return config


def digits(repa: bool = True) -> ConfigDict:
    """A small SiT on the 8×8 digits (pixel space), with REPA against dew's contrastive encoder
    (``repa``) or without it; everything else equal."""
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "digits", "batch_size": 128})
    config.objective = ConfigDict(
        {
            "name": "interpolant",
            "path": "Linear",
            "prediction": "velocity",
            "condition": "class_label",
            "repa": {
                "encoder": "image_encoder" if repa else None,
                "encoder_weights": None,
                "encoder_depth": 2,
                "proj_coeff": 0.5,
                "projector_dim": 256,
            },
            "sampling": {"sampler": "transport_ode", "steps": 50, "per_class": 10},
        }
    )
    config.model = ConfigDict(
        {
            "name": "sit",
            "depth": 4,
            "hidden_size": 128,
            "num_heads": 4,
            "patch_size": 4,
            "input_size": 8,
            "num_classes": 10,
            "class_dropout_prob": 0.1,
        }
    )
    config.optimizer = ConfigDict({"learning_rate": 1e-3, "warmup_steps": 100, "grad_clip": 1.0})
    config.ema = ConfigDict({"decay": 0.999})
    config.train = ConfigDict({"num_steps": 100_000, "log_every": 50})
    config.checkpoint = ConfigDict({"every": 500})
    config.eval = ConfigDict({"every": 0})
    config.preview = ConfigDict({"every": 0})
    return config


def get_config(arg: str | None = None) -> ConfigDict:
    """``arg``: ``digits`` (the default), ``digits-baseline`` or one of ``IMAGENET_SIZES``."""
    arg = arg or "digits"
    if arg == "digits":
        return digits(True)
    if arg == "digits-baseline":
        return digits(False)
    if arg in IMAGENET_SIZES:
        return imagenet(arg)
    presets = ["digits", "digits-baseline", *IMAGENET_SIZES]
    raise ValueError(f"experiments/repa.py:{arg} is unknown: expected one of {presets}")
