"""Latent diffusion (EDM2's ImageNet-512 pipeline, in miniature) on scikit-learn's digits.

The digits are upsampled 4x (nearest) to 32x32 RGB, a small Stable Diffusion VAE is trained on
them by dew (``experiments/latent_digits_vae.py``; the published sd-vae-ft-mse weights are not on
this machine), the digits are encoded once into a latent data set with it, and EDM is trained on
the latents; previews, ``dew.pipeline`` and ``python -m dew.sample`` decode through its decoder.

    python experiments/latent_digits_data.py --dest=runs/latent_digits_data --images_only
    python -m dew.main --config=experiments/latent_digits_vae.py --workdir=runs/latent_digits_vae
    python experiments/latent_digits_data.py --dest=runs/latent_digits_data --vae_run=runs/latent_digits_vae
    python -m dew.main --config=experiments/latent_digits.py --workdir=runs/latent_digits

The third command exports the VAE to ``<DATA>/vae.safetensors`` (the published layout), measures
its latent scaling on the digits (``<DATA>/vae_scaling.json``: edm2's ``raw_mean``/``raw_std``)
and encodes ``<DATA>/latents``. The VAE's shape (block_out_channels (32, 32, 64), one layer per
block, 8 groups: 32x32 pixels -> 8x8x4 latents) is ``latent_digits_data.VAE``. With the real
weights, set ``config.objective.latent.weights`` and the ``vae_*`` keys to sd-vae-ft-mse's (the
section's defaults, with ``scaling_file=''``; 32x32 pixels are then 4x4 latents, and
``config.model`` must shrink to match).
"""

import importlib.util
import pathlib

from ml_collections import ConfigDict

DATA = "runs/latent_digits_data"


def _edm_config() -> ConfigDict:
    """experiments/edm.py's config (network, optimizer, EMA, cadences), read beside this file."""
    spec = importlib.util.spec_from_file_location(
        "_dew_latent_digits_edm", pathlib.Path(__file__).with_name("edm.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config() -> ConfigDict:
    config = _edm_config()
    config.dataset = ConfigDict(
        {"name": "latent_dataset", "batch_size": 64, "path": f"{DATA}/latents", "use_labels": True}
    )
    config.objective.latent = ConfigDict(
        {
            "encoder": "stability_vae",
            "weights": f"{DATA}/vae.safetensors",
            "allow_unpinned": True,  # a VAE dew trained has no published digest
            "scaling_file": f"{DATA}/vae_scaling.json",
            "vae_channels": (32, 32, 64),
            "vae_layers_per_block": 1,
            "vae_groups": 8,
            "vae_latent_channels": 4,
        }
    )
    # FID/FD need reference statistics; the digits classifier reads 8x8 grey digits, not these.
    config.preview.metrics = ()
    return config
