"""Make decode_goldens.npz and tiny_vae.safetensors: the published checkpoints' decode, run by
the references' own lines on diffusers' ``AutoencoderKL`` with random weights. See README.md.

    python third_party/sd_vae/decode_goldens/make_goldens.py --out=third_party/sd_vae/decode_goldens
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
# sd-vae-ft-mse's config.json (four blocks: three downsamplings, 8 pixels per latent; two layers
# per block; SiLU; mid-block attention; quant_conv / post_quant_conv) at a small width.
CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(8, 16, 32, 32),
    layers_per_block=2,
    act_fn="silu",
    latent_channels=4,
    norm_num_groups=4,
    sample_size=32,
)
SD_SCALE = 0.18215  # DiT sample_ddp.py's `samples / 0.18215`; REPA generate.py's latents_scale


def _weights_module():
    spec = importlib.util.spec_from_file_location("sd_vae_weights", HERE.parent / "weights.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="the folder for the .npz and the .safetensors")
    args = parser.parse_args()

    import diffusers
    import safetensors.torch
    import torch

    torch.set_num_threads(2)
    out_dir = pathlib.Path(args.out)
    gen = _weights_module()
    vae = diffusers.models.AutoencoderKL(**CONFIG).eval().requires_grad_(False)
    with torch.no_grad():
        for name, p in vae.state_dict().items():
            p.copy_(torch.from_numpy(gen.parameter(name, tuple(p.shape))))
    # The weights as the file dew's converter reads (diffusers' own names, F32).
    weights = {k: v.contiguous() for k, v in vae.state_dict().items()}
    safetensors.torch.save_file(weights, str(out_dir / "tiny_vae.safetensors"), metadata={"format": "pt"})
    vae64 = diffusers.models.AutoencoderKL(**CONFIG).eval().requires_grad_(False).double()
    vae64.load_state_dict({k: v.double() for k, v in weights.items()})

    rng = np.random.default_rng(20261205)
    # What a DiT/SiT/REPA network samples: final latents, about unit scale, [N, 4, 4, 4] (NCHW)
    latents = rng.standard_normal((3, 4, 4, 4)).astype(np.float32)
    out: dict[str, Any] = {"latents": latents, "config": np.str_(json.dumps(CONFIG))}
    with torch.no_grad():
        samples = torch.from_numpy(latents)
        # facebookresearch/DiT sample_ddp.py (and willisma/SiT's), after the sampling loop:
        dit = vae.decode(samples / 0.18215).sample
        out["decoded"] = dit.numpy()  # the decoder's output, float32, nominally [-1, 1]
        out["dit/float"] = (127.5 * dit + 128.0).numpy()  # before the clamp and the cast
        dit = torch.clamp(127.5 * dit + 128.0, 0, 255)
        out["dit/uint8"] = dit.permute(0, 2, 3, 1).to("cpu", dtype=torch.uint8).numpy()

        # sihyun-yu/REPA generate.py, after the sampling loop:
        device = "cpu"
        latents_scale = torch.tensor([0.18215, 0.18215, 0.18215, 0.18215]).view(1, 4, 1, 1).to(device)
        latents_bias = -torch.tensor([0.0, 0.0, 0.0, 0.0]).view(1, 4, 1, 1).to(device)
        repa = vae.decode((samples - latents_bias) / latents_scale).sample
        repa = (repa + 1) / 2.0
        out["repa/float"] = (255.0 * repa).numpy()
        repa = torch.clamp(255.0 * repa, 0, 255).permute(0, 2, 3, 1).to("cpu", dtype=torch.uint8).numpy()
        out["repa/uint8"] = repa

        # The same decode in float64: how far float32 roundoff moves the decoder's output.
        out["decoded64"] = vae64.decode(samples.double() / 0.18215).sample.numpy()

        # REPA's preprocessing/encoders.py encode_pixels (edm2's, with pixels / 127.5 - 1): raw
        # latents (mean || std) of uint8 images, the data set DiT/SiT/REPA latents come from.
        images = torch.from_numpy(rng.integers(0, 256, (2, 3, 32, 32), dtype=np.uint8))
        out["encode/images"] = images.numpy()
        x = images.to(torch.float32) / 127.5 - 1
        d = vae.encode(x)["latent_dist"]
        out["encode/raw"] = torch.cat([d.mean, d.std], dim=1).numpy()
        d = vae64.encode(images.to(torch.float64) / 127.5 - 1)["latent_dist"]
        out["encode/raw64"] = torch.cat([d.mean, d.std], dim=1).numpy()
    np.savez_compressed(str(out_dir / "decode_goldens.npz"), **out)
    d = out["decoded"]
    print(
        f"decoded range [{d.min():.3f}, {d.max():.3f}], below -1: {(d < -1).mean():.3f}, above 1: "
        f"{(d > 1).mean():.3f}; max |f32 - f64| {np.abs(d - out['decoded64']).max():.3g}; "
        f"DiT vs REPA uint8 differ on {(out['dit/uint8'] != out['repa/uint8']).mean():.3f}"
    )
    for p in sorted(out_dir.iterdir()):
        print(p.name, p.stat().st_size)


if __name__ == "__main__":
    main()
