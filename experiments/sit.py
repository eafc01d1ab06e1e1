"""SiT (Ma et al. 2024) on ImageNet-256 latents: willisma/SiT's ``train.py``.

    python -m dew.main --config=experiments/sit.py:SiT-XL/2 --workdir=runs/sit-xl2 \
        --config.dataset.path=datasets/imagenet256-sd
    python -m dew.sample --workdir=runs/sit-xl2 --cfg_scale=4.0 --sampler=transport_ode
    python -m dew.fid --workdir=runs/sit-xl2 --num_samples=50000 ...   # SDE, cfg 1.5, 250 steps

Every size the reference's ``SiT_models`` names (``SiT-S/8`` … ``SiT-XL/2``) resolves to what its
``train.py`` resolves (``tests/test_dit_configs.py`` checks each against
``third_party/sit/configs.json``, which the reference's own argument parsing produced:
``third_party/dit/make_configs.py --ref=sit``). What it shares with DiT's ``train.py`` (AdamW
1e-4 without weight decay, batch 256, 1,400 epochs = 7,005,600 updates, EMA 0.9999 and how
dew's zero-started debiased EMA differs from the reference's copy of the initial weights, the
SD-VAE latents × 0.18215 through ``latent_dataset`` with ADM's center crop, the unflipped
latents, checkpoints every 50,000 updates) is ``experiments/dit.py``'s and documented there.
SiT's own:

* the network: the registered ``SiT-<size>/<patch>`` (DiT's, built ``learn_sigma=True`` and
  returning its first 4 channels, as SiT's ``forward`` does), 1,000 classes, label dropout 0.1;
* the objective: ``interpolant`` with ``create_transport``'s defaults (``--path-type Linear
  --prediction velocity --loss-weight None``, ``train_eps``/``sample_eps`` None: the path's own,
  0 for Linear);
* sampling (``dew.pipeline``, ``python -m dew.sample``, ``python -m dew.fid``): the published FID
  2.06's, ``sample_ddp.py SDE --cfg-scale 1.5`` with its defaults: Euler–Maruyama over 250 steps,
  diffusion form ``sigma`` with norm 1.0, last step ``Mean`` of size 0.04 (the registered
  ``transport_sde``), guidance on the first 3 channels over the whole interval. SiT's
  ``sample.py`` visuals (ODE, dopri5, cfg 4.0) are ``--sampler=transport_ode --steps=50
  --cfg_scale=4.0``.

SiT's ``train.py`` also draws ODE samples at cfg 4.0 every 10,000 steps for its logs; they do
not affect training and are not drawn here (``config.preview.every = 0``).
"""

from __future__ import annotations

import importlib.util
import pathlib

from ml_collections import ConfigDict


def _dit():
    spec = importlib.util.spec_from_file_location(
        "experiments_dit", pathlib.Path(__file__).with_name("dit.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DIT = _dit()
SIZES = DIT.SIZES
FID_SAMPLING = {
    "sampler": "transport_sde",  # Euler, sigma form, norm 1.0, last step Mean of 0.04
    "steps": 250,
    "cfg_scale": 1.5,
    "cfg_channels": 3,
    "guidance_interval": (0.0, 1.0),
    "per_class": 1,
}


def get_config(arg: str | None = None) -> ConfigDict:
    """``arg``: a size as the reference names it, ``SiT-XL/2`` by default (train.py's), or
    ``digits`` (the CPU-scale run of ``experiments/dit.py``'s ``digits``, with SiT's objective)."""
    arg = arg or "SiT-XL/2"
    if arg == "digits":
        objective = ConfigDict(
            {
                "name": "interpolant",
                "path": "Linear",
                "prediction": "velocity",
                "condition": "class_label",
                "sampling": {"sampler": "transport_ode_heun2", "steps": 35, "per_class": 10},
            }
        )
        return DIT.digits(objective, "sit")
    size = arg.removeprefix("SiT-")
    if size not in SIZES:
        raise ValueError(
            f"experiments/sit.py:{arg} is unknown: expected one of {[f'SiT-{s}' for s in SIZES]}"
        )
    config = ConfigDict()
    DIT.training(config, DIT.BATCH, DIT.EPOCHS)
    config.objective = ConfigDict(
        {
            "name": "interpolant",
            "path": "Linear",
            "prediction": "velocity",
            "loss_weight": None,
            "train_eps": None,
            "sample_eps": None,
            "learn_sigma": False,  # the SiT network already returns the first 4 channels
            "condition": "class_label",
            "latent": dict(DIT.LATENT),
            "sampling": dict(FID_SAMPLING),
        }
    )
    config.model = DIT.network(f"SiT-{size}")
    config.preview = ConfigDict({"every": 0})
    return config
