"""Make the latent digits data set of ``experiments/latent_digits.py``.

    python experiments/latent_digits_data.py --dest=runs/latent_digits_data [--weights=VAE.safetensors]

Writes ``<dest>/images`` (the 1,617 training digits, upsampled 4x by nearest neighbour to 32x32,
grey repeated to RGB, as an NVlabs/edm-format folder of PNGs with ``dataset.json`` labels) and
encodes them into ``<dest>/latents`` with ``dew.data.sources.latent_dataset.encode_dataset``.
Without ``--weights`` the VAE is a random-weight one at reduced width (``VAE``; seed 0), written in
the published safetensors layout to ``<dest>/random_vae.safetensors`` and said so on stdout: the
pipeline is real, the decoded images are not digits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from dew.networks import sd_vae

VAE = sd_vae.VAEConfig(
    block_out_channels=(32, 32, 64), layers_per_block=1, latent_channels=4, norm_num_groups=8
)
UPSAMPLE = 4


def random_vae_params(config: sd_vae.VAEConfig, seed: int = 0) -> dict:
    """Random haiku params of both VAE halves: GroupNorm scales 1 + N(0, 1)/√fan_in, every other
    array N(0, 1)/√fan_in (fan_in: the product of all but the last axis), so activations keep
    their scale through the network."""
    rng = np.random.default_rng(seed)
    return {
        module: {
            k: (1.0 if k == "scale" else 0.0)
            + rng.standard_normal(s).astype(np.float32) / np.float32(np.sqrt(np.prod(s[:-1]) or 1))
            for k, s in leaves.items()
        }
        for module, leaves in sd_vae.expected_shapes(config).items()
    }


def write_random_vae(path: str, config: sd_vae.VAEConfig = VAE, seed: int = 0) -> None:
    from dew.networks.sd_vae_weights import save_safetensors, torch_state_dict

    save_safetensors(path, torch_state_dict(random_vae_params(config, seed)))


def write_digit_images(folder: str, count: int | None = None) -> int:
    """The training digits as 32x32 RGB PNGs plus ``dataset.json``; returns how many."""
    from PIL import Image

    from dew.data.sources.digits import digits

    source = digits("train")
    images, labels = source.fields["image"][:count], source.fields["label"][:count]
    pixels = np.round((images + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
    pixels = pixels.repeat(UPSAMPLE, axis=1).repeat(UPSAMPLE, axis=2).repeat(3, axis=3)
    os.makedirs(folder, exist_ok=True)
    entries = []
    for i, (image, label) in enumerate(zip(pixels, labels, strict=True)):
        name = f"img{i:05d}.png"
        Image.fromarray(image).save(os.path.join(folder, name))
        entries.append([name, int(label)])
    with open(os.path.join(folder, "dataset.json"), "w") as f:
        json.dump({"labels": entries}, f)
    return len(entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", default="runs/latent_digits_data")
    parser.add_argument("--weights", default=None, help="a VAE safetensors file of VAE's shape")
    parser.add_argument("--max_images", type=int, default=None)
    args = parser.parse_args(argv)
    from dew.data.sources.latent_dataset import encode_dataset
    from dew.encoding.stability_vae import StabilityVAECodec
    from dew.networks.sd_vae_weights import default_path, load_weights

    weights = args.weights
    if weights is None:
        weights = os.path.join(args.dest, "random_vae.safetensors")
        os.makedirs(args.dest, exist_ok=True)
        write_random_vae(weights)
        print(
            f"sd-vae-ft-mse weights: not used (absent here: {default_path()}); encoding with a "
            f"RANDOM-WEIGHT VAE at reduced width {VAE.block_out_channels} -> {weights}: decoded "
            "images will not look like digits"
        )
    images = os.path.join(args.dest, "images")
    if not os.path.isfile(os.path.join(images, "dataset.json")):
        print(f"{write_digit_images(images, args.max_images)} digits -> {images}")
    codec = StabilityVAECodec(load_weights(weights, allow_unpinned=True, config=VAE), VAE)
    report = encode_dataset(images, os.path.join(args.dest, "latents"), codec, batch_size=64)
    print(f"{args.dest}/latents: {report.total} latents ({report.encoded} encoded now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
