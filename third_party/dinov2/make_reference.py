"""Make dinov2_reference.npz: facebookresearch/dinov2's own ViT and NVlabs/edm2's own DINOv2
preprocessing, run on random weights at a tiny width. See README.md beside this file.

Run with a PyTorch venv (no xformers), a checkout of facebookresearch/dinov2 and one of NVlabs/edm2:

    XFORMERS_DISABLED=1 python third_party/dinov2/make_reference.py --dinov2=<dinov2 checkout> \
        --edm2=<edm2 checkout> --out=third_party/dinov2/dinov2_reference.npz
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import types

import numpy as np

EMBED_DIM, DEPTH, HEADS, PATCH, IMG_SIZE = 32, 2, 2, 14, 518  # 37x37 learned grid, as ViT-L/14
SAMPLED = 4096  # preprocessed values kept per case (at fixed random positions)


def randomize(model, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Overwrite every parameter with seeded draws that keep activations O(1); return them."""
    import torch

    out = {}
    with torch.no_grad():
        for name, p in model.state_dict().items():
            shape = tuple(p.shape)
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
                a = 1.0 + 0.2 * rng.standard_normal(shape)
            elif name.endswith(".gamma"):
                a = rng.uniform(0.5, 1.5, shape)
            elif name.endswith("bias"):
                a = 0.1 * rng.standard_normal(shape)
            elif p.ndim >= 2 and name != "pos_embed" and name != "cls_token":
                fan_in = int(np.prod(shape[1:]))
                a = rng.standard_normal(shape) / np.sqrt(fan_in)
            else:  # cls_token, pos_embed, mask_token
                a = rng.standard_normal(shape)
            p.copy_(torch.from_numpy(a.astype(np.float32)))
            out[name] = a.astype(np.float32)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dinov2", required=True, help="facebookresearch/dinov2 checkout (holds dinov2/)")
    parser.add_argument("--edm2", required=True, help="NVlabs/edm2 checkout (holds calculate_metrics.py)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("XFORMERS_DISABLED", "1")
    sys.path[:0] = [args.dinov2, args.edm2]

    import torch

    torch.set_num_threads(2)
    # dinov2_vitl14 = _make_dinov2_model(arch_name="vit_large"): vit_large(img_size=518, patch_size=14,
    # init_values=1.0, ffn_layer="mlp", block_chunks=0, num_register_tokens=0,
    # interpolate_antialias=False, interpolate_offset=0.1); vit_large is DinoVisionTransformer with
    # embed_dim 1024, depth 24, heads 16, MemEffAttention. The same at a tiny width:
    from functools import partial

    from dinov2.hub.backbones import _make_dinov2_model  # noqa: F401  (the hub entry's defaults)
    from dinov2.layers import MemEffAttention, NestedTensorBlock
    from dinov2.models import vision_transformer as vits

    model = vits.DinoVisionTransformer(
        img_size=IMG_SIZE,
        patch_size=PATCH,
        embed_dim=EMBED_DIM,
        depth=DEPTH,
        num_heads=HEADS,
        mlp_ratio=4,
        block_fn=partial(NestedTensorBlock, attn_class=MemEffAttention),
        init_values=1.0,
        ffn_layer="mlp",
        block_chunks=0,
        num_register_tokens=0,
        interpolate_antialias=False,
        interpolate_offset=0.1,
    ).eval()
    rng = np.random.default_rng(20261203)
    weights = randomize(model, rng)
    model64 = copy.deepcopy(model).double()  # the same weights, in float64

    # edm2's detector without its torch.hub download: the same class, its own __call__.
    import calculate_metrics

    def detector(network):
        d = object.__new__(calculate_metrics.DINOv2Detector)
        d.feature_dim, d.resize_mode, d.model = EMBED_DIM, "torch", network
        return d

    class Float64(torch.nn.Module):  # the reference ViT in float64 on edm2's float32 input
        def forward(self, x):
            return model64(x.to(torch.float64))

    identity = types.SimpleNamespace(to=lambda device: lambda x: x)
    out: dict[str, np.ndarray] = {f"weights/{k}": v for k, v in weights.items()}
    with torch.no_grad():
        x = torch.from_numpy(rng.standard_normal((2, 3, 28, 28)).astype(np.float32))
        out["vit28/x"] = x.numpy()
        out["vit28/features32"] = model(x).numpy()
        out["vit28/features64"] = model64(x.double()).numpy()
        cases = {
            "up": rng.integers(0, 256, (2, 3, 24, 24), dtype=np.uint8),
            "down": rng.integers(0, 256, (1, 3, 250, 230), dtype=np.uint8),
        }
        for case, images in cases.items():
            t = torch.from_numpy(images)
            out[f"{case}/images"] = images
            pre = detector(identity)(t).numpy()  # [N, 3, 224, 224] float32
            index = np.sort(rng.choice(pre.size, SAMPLED, replace=False))
            out[f"{case}/preprocessed_index"] = index.astype(np.int64)
            out[f"{case}/preprocessed"] = pre.reshape(-1)[index]
            # The same operation in float64 (edm2's lines with its float32 cast left out): PyTorch's
            # float32 path rounds the sample positions, an error dew's bound accounts for separately.
            x64 = torch.nn.functional.interpolate(t.double(), size=(224, 224), mode="bicubic", antialias=True)
            mean = torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64).reshape(1, -1, 1, 1)
            std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64).reshape(1, -1, 1, 1)
            out[f"{case}/preprocessed64"] = ((x64 / 255 - mean) / std).numpy().reshape(-1)[index]
            out[f"{case}/features32"] = detector(model)(t).numpy()
            out[f"{case}/features64"] = detector(Float64())(t).numpy()
    np.savez(args.out, **out)
    print(f"wrote {args.out}: {len(out)} arrays, {sum(a.nbytes for a in out.values())} bytes")


if __name__ == "__main__":
    main()
