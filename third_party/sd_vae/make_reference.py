"""Make sd_vae_reference.npz: diffusers' own ``AutoencoderKL`` and NVlabs/edm2's own
``StabilityVAEEncoder`` (training/encoders.py) on a tiny random-weight VAE. See README.md.

    python third_party/sd_vae/make_reference.py --edm2=<NVlabs/edm2 checkout> \
        --out=third_party/sd_vae/sd_vae_reference.npz
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
# sd-vae-ft-mse's config.json at a tiny width: two blocks (one downsampling), 8 groups, 1 layer per block.
CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    block_out_channels=(32, 64),
    layers_per_block=1,
    act_fn="silu",
    latent_channels=4,
    norm_num_groups=8,
    sample_size=16,
)


def _weights_module():
    spec = importlib.util.spec_from_file_location("sd_vae_weights", HERE / "weights.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--edm2", required=True, help="NVlabs/edm2 checkout (holds training/encoders.py)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sys.path.insert(0, args.edm2)

    import diffusers
    import safetensors.torch
    import torch

    torch.set_num_threads(2)
    from training import encoders  # edm2's own module

    gen = _weights_module()
    vae = diffusers.models.AutoencoderKL(**CONFIG).eval().requires_grad_(False)
    with torch.no_grad():
        for name, p in vae.state_dict().items():
            p.copy_(torch.from_numpy(gen.parameter(name, tuple(p.shape))))
    vae64 = copy.deepcopy(vae).double()

    # edm2's encoder with the tiny VAE in place of the downloaded one (init() then only moves it).
    enc = encoders.StabilityVAEEncoder(vae_name="tiny (not downloaded)", batch_size=8)
    enc._vae = vae
    rng = np.random.default_rng(20261203)
    images = rng.integers(0, 256, (2, 3, 16, 16), dtype=np.uint8)
    out: dict[str, np.ndarray] = {"images": images}
    # diffusers' own state_dict names and shapes (the test regenerates the arrays from weights.py)
    out["state_dict"] = np.str_(json.dumps({k: list(v.shape) for k, v in vae.state_dict().items()}))
    with torch.no_grad():
        raw = enc.encode_pixels(torch.from_numpy(images))  # [N, 8, 8, 8]: mean, std
        out["encoder/raw32"] = raw.numpy()
        d = vae64.encode(torch.from_numpy(images).to(torch.float64) / 255)["latent_dist"]
        out["encoder/mean64"], out["encoder/std64"] = d.mean.numpy(), d.std.numpy()

        noise = torch.from_numpy(rng.standard_normal((2, 4, 8, 8)).astype(np.float32))
        real_randn_like = torch.randn_like
        torch.randn_like = lambda x: noise.to(x.dtype)  # edm2's encode_latents draws with randn_like
        try:
            final = enc.encode_latents(raw)
        finally:
            torch.randn_like = real_randn_like
        out["scaling/noise"], out["scaling/final"] = noise.numpy(), final.numpy()
        out["scaling/scale"], out["scaling/bias"] = np.asarray(enc.scale), np.asarray(enc.bias)

        out["decoder/pixels"] = enc.decode(final).numpy()  # uint8, edm2's clamp/mul/cast
        z = (final - torch.from_numpy(enc.bias).reshape(1, -1, 1, 1)) / torch.from_numpy(enc.scale).reshape(
            1, -1, 1, 1
        )
        out["decoder/z"] = z.numpy()
        out["decoder/sample32"] = vae.decode(z)["sample"].numpy()
        out["decoder/sample64"] = vae64.decode(z.double())["sample"].numpy()

    # The safetensors reader's input: a few arrays in each dtype, written by safetensors itself.
    tensors = {
        "f32": torch.from_numpy(rng.standard_normal((3, 5)).astype(np.float32)),
        "f16": torch.from_numpy(rng.standard_normal((4,)).astype(np.float16)),
        "bf16": torch.from_numpy(rng.standard_normal((2, 3)).astype(np.float32)).to(torch.bfloat16),
        "encoder.conv_in.weight": vae.state_dict()["encoder.conv_in.weight"][:2].clone(),
    }
    blob = safetensors.torch.save(tensors, metadata={"format": "pt"})
    out["safetensors/file"] = np.frombuffer(blob, np.uint8)
    for k, v in tensors.items():
        out[f"safetensors/{k}"] = v.to(torch.float32).numpy()
    np.savez(args.out, **out)
    print(f"wrote {args.out}: {len(out)} arrays, {sum(a.nbytes for a in out.values())} bytes")


if __name__ == "__main__":
    main()
