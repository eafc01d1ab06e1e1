"""Make the latent digits data set of ``experiments/latent_digits.py``.

    python experiments/latent_digits_data.py --dest=runs/latent_digits_data --images_only
    python -m dew.main --config=experiments/latent_digits_vae.py --workdir=runs/latent_digits_vae
    python experiments/latent_digits_data.py --dest=runs/latent_digits_data --vae_run=runs/latent_digits_vae

Writes ``<dest>/images`` (the 1,617 training digits, upsampled 4x by nearest neighbour to 32x32,
grey repeated to RGB, as an NVlabs/edm-format folder of PNGs with ``dataset.json`` labels) and
encodes them into ``<dest>/latents`` with ``dew.data.sources.latent_dataset.encode_dataset``.

The VAE (shape ``VAE``) is one of, exactly one asked for:

- ``--vae_run=WORKDIR``: the VAE dew trained (``experiments/latent_digits_vae.py``), its debiased
  EMA parameters exported to ``<dest>/vae.safetensors`` in the published sd-vae-ft-mse layout
  (``export_vae``), so the rest of the pipeline reads it as it would read the real weights;
- ``--weights=FILE``: a VAE safetensors file of ``VAE``'s shape;
- ``--random_vae``: a random-weight VAE (seed 0) written to ``<dest>/random_vae.safetensors``,
  **for tests of the plumbing only**: its decoded images are not digits.

Whichever it is, the latent scaling is measured on the data (``latent_scaling``: per-channel mean
and std of the raw latents mean + ε·std over the training digits, as edm2's
``StabilityVAEEncoder`` takes ``raw_mean``/``raw_std``) and written with the VAE's held-out PSNR
(the 180 validation digits, posterior mean decoded) to ``<dest>/vae_scaling.json``, which
``experiments/latent_digits.py`` names as ``config.objective.latent.scaling_file``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from dew.networks import sd_vae

# The VAE's shape: experiments/latent_digits_vae.py's (32x32x3 pixels -> 8x8x4 latents).
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
    pixels, labels = upsampled(source.fields["image"][:count]), source.fields["label"][:count]
    os.makedirs(folder, exist_ok=True)
    entries = []
    for i, (image, label) in enumerate(zip(pixels, labels, strict=True)):
        name = f"img{i:05d}.png"
        Image.fromarray(image).save(os.path.join(folder, name))
        entries.append([name, int(label)])
    with open(os.path.join(folder, "dataset.json"), "w") as f:
        json.dump({"labels": entries}, f)
    return len(entries)


def export_vae(params, path: str) -> None:
    """Haiku params of both VAE halves -> ``path`` in the published safetensors layout."""
    from dew.networks.sd_vae_weights import save_safetensors, torch_state_dict

    save_safetensors(path, torch_state_dict(params))


def upsampled(images: np.ndarray) -> np.ndarray:
    """Digits in [-1, 1] [N, 8, 8, 1] -> uint8 [N, 32, 32, 3], as ``write_digit_images`` stores them."""
    pixels = np.round((images + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
    return pixels.repeat(UPSAMPLE, axis=1).repeat(UPSAMPLE, axis=2).repeat(3, axis=3)


def latent_scaling(codec, pixels: np.ndarray, seed: int = 0, batch: int = 256) -> dict:
    """Per-channel mean and std of raw latents mean + ε·std (ε from ``seed``) of uint8 ``pixels``
    [N, H, W, 3], float64 accumulation: edm2's ``raw_mean``/``raw_std`` for this VAE and data."""
    import jax

    encode = jax.jit(codec.encode_pixels)
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(0, len(pixels), batch):
        raw = np.asarray(encode(pixels[i : i + batch]), np.float64)
        mean, std = np.split(raw, 2, axis=-1)
        samples.append((mean + rng.standard_normal(mean.shape) * std).reshape(-1, mean.shape[-1]))
    z = np.concatenate(samples)
    return {"raw_mean": z.mean(axis=0).tolist(), "raw_std": z.std(axis=0).tolist()}


def held_out_psnr(codec, pixels: np.ndarray) -> float:
    """PSNR (dB, peak 1) of the posterior mean's decoded images on uint8 ``pixels`` in [0, 1]."""
    import jax
    import jax.numpy as jnp

    from dew.networks import sd_vae

    def reconstruct(p):
        x = p.astype(jnp.float32) / 255
        mean, _ = sd_vae.mean_and_std(sd_vae.encoder_network(codec.config).apply(codec.params, x))
        return jnp.clip(sd_vae.decoder_network(codec.config).apply(codec.params, mean), 0.0, 1.0)

    y = np.asarray(jax.jit(reconstruct)(pixels), np.float64)
    mse = np.mean(np.square(y - pixels / 255.0))
    return float(10 * np.log10(1.0 / mse))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dest", default="runs/latent_digits_data")
    parser.add_argument("--vae_run", default=None, help="workdir of experiments/latent_digits_vae.py")
    parser.add_argument("--weights", default=None, help="a VAE safetensors file of VAE's shape")
    parser.add_argument("--random_vae", action="store_true", help="a random-weight VAE (tests only)")
    parser.add_argument("--images_only", action="store_true", help="write <dest>/images and stop")
    parser.add_argument("--max_images", type=int, default=None)
    args = parser.parse_args(argv)
    images = os.path.join(args.dest, "images")
    if not os.path.isfile(os.path.join(images, "dataset.json")):
        print(f"{write_digit_images(images, args.max_images)} digits -> {images}")
    if args.images_only:
        return 0
    chosen = [a for a in ("vae_run", "weights", "random_vae") if getattr(args, a)]
    if len(chosen) != 1:
        parser.error(f"give exactly one of --vae_run, --weights, --random_vae (got {chosen or 'none'})")

    from dew.data.sources.digits import digits
    from dew.data.sources.latent_dataset import encode_dataset
    from dew.encoding.stability_vae import StabilityVAECodec
    from dew.networks.sd_vae_weights import load_weights

    weights = args.weights
    if args.random_vae:
        weights = os.path.join(args.dest, "random_vae.safetensors")
        write_random_vae(weights)
        print(f"RANDOM-WEIGHT VAE {VAE.block_out_channels} -> {weights}: decoded images will not be digits")
    elif args.vae_run:
        from dew.inference import pipeline

        run = pipeline(args.vae_run)
        weights = os.path.join(args.dest, "vae.safetensors")
        export_vae(run.params, weights)
        print(f"{args.vae_run} step {run.step} (EMA) -> {weights}")
    codec = StabilityVAECodec(load_weights(weights, allow_unpinned=True, config=VAE), VAE)
    train = upsampled(digits("train").fields["image"][: args.max_images])
    info = latent_scaling(codec, train)
    info["held_out_psnr_db"] = held_out_psnr(codec, upsampled(digits("validation").fields["image"]))
    info["weights"] = weights
    with open(os.path.join(args.dest, "vae_scaling.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"{args.dest}/vae_scaling.json: {info}")
    report = encode_dataset(images, os.path.join(args.dest, "latents"), codec, batch_size=64)
    print(f"{args.dest}/latents: {report.total} latents ({report.encoded} encoded now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
