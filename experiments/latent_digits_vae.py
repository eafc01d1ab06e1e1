"""The VAE of ``experiments/latent_digits.py``, trained by dew: ``dew.objectives.autoencoder`` (MSE
+ beta * KL, Stable Diffusion's VAE at reduced width) on the 32x32 RGB upsampled digits that
``experiments/latent_digits_data.py --images_only`` writes as an NVlabs/edm-format folder.

    python experiments/latent_digits_data.py --dest=runs/latent_digits_data --images_only
    python -m dew.main --config=experiments/latent_digits_vae.py --workdir=runs/latent_digits_vae

Previews: a row of digits over their reconstructions. The VAE's shape (block_out_channels
(32, 32, 64), one layer per block, 8 groups, 4 latent channels: 32x32 pixels -> 8x8x4 latents)
is ``latent_digits_data.VAE``'s and ``latent_digits.py``'s ``config.objective.latent``'s.
"""

import importlib.util
import pathlib

from ml_collections import ConfigDict

DATA = "runs/latent_digits_data"


def _edm_config() -> ConfigDict:
    """experiments/edm.py's config (optimizer, cadences, checkpoints), read beside this file."""
    spec = importlib.util.spec_from_file_location(
        "_dew_latent_digits_vae_edm", pathlib.Path(__file__).with_name("edm.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config() -> ConfigDict:
    config = _edm_config()
    config.dataset = ConfigDict({"name": "image_folder", "batch_size": 32, "path": f"{DATA}/images"})
    config.objective = ConfigDict(
        {
            "name": "autoencoder",
            "beta": 1e-4,
            "vae_channels": (32, 32, 64),
            "vae_layers_per_block": 1,
            "vae_groups": 8,
            "vae_latent_channels": 4,
        }
    )
    config.optimizer.learning_rate = 1e-3
    config.train.num_steps = 1500
    config.train.log_every = 50
    config.checkpoint.every = 500
    config.eval.every = 500
    config.preview.every = 500
    config.preview.metrics = ()
    return config
