"""Make the REPA goldens: sihyun-yu/REPA's own ``SILoss`` (loss.py), its own ``preprocess_raw_image``
(train.py) and ``load_encoders``' DINOv2 position resampling (utils.py) around facebookresearch/
dinov2's own ViT, and its own ``parse_args`` (train.py) and ``generate.py`` argument parser. See
README.md beside this file.

    XFORMERS_DISABLED=1 python third_party/repa/make_reference.py --repa=<REPA checkout> \
        --dinov2=<facebookresearch/dinov2 checkout> --out=third_party/repa

REPA's ``train.py`` and ``generate.py`` import accelerate, diffusers and wandb at module level,
none of which the losses or the parsers use: the parsers are run by executing the files' own
``parse_args`` function / ``__main__`` parser block (read from the file, unmodified) with only
``argparse`` (and ``SiT_models`` for ``--model``'s choices).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys

import numpy as np

B, C, H, PATCH = 3, 4, 8, 2  # the loss case: latents [3, 4, 8, 8], 16 tokens
Z_DIMS = (12, 20)  # two encoders (REPA's comma-separated --enc-type)
SEED = 20261205


def siloss_case(repa: str) -> dict[str, np.ndarray]:
    """REPA's SILoss on fixed images, a stand-in network and fixed encoder tokens."""
    import torch

    sys.path.insert(0, repa)
    from loss import SILoss

    rng = np.random.default_rng(SEED)
    tokens = (H // PATCH) ** 2
    out: dict[str, np.ndarray] = {
        "x": rng.standard_normal((B, C, H, H)).astype(np.float32),
        "a": rng.uniform(0.5, 1.5, (C,)).astype(np.float32),
        "b": rng.standard_normal((C,)).astype(np.float32),
    }
    for k, d in enumerate(Z_DIMS):
        out[f"w{k}"] = (rng.standard_normal((C * PATCH * PATCH, d)) / 4).astype(np.float32)
        out[f"u{k}"] = rng.standard_normal((d,)).astype(np.float32)
        z = rng.standard_normal((B, tokens, d)).astype(np.float32)
        z[1, 3] = 0.0  # a zero token: F.normalize's eps branch (cosine 0)
        out[f"z{k}"] = z

    class StandIn(torch.nn.Module):
        """out = a·x + t·b per channel; projected tokens k = tanh(patches(x) @ w_k + t·u_k),
        patches in (c, p, q) order per token, tokens row-major."""

        def __init__(self, arrays, dtype):
            super().__init__()
            self.arrays = {k: torch.from_numpy(v).to(dtype) for k, v in arrays.items()}

        def forward(self, x, t, y=None):
            a = self.arrays
            n = x.shape[0]
            self.seen = (x.detach().clone(), t.detach().clone())
            v = x * a["a"].view(1, C, 1, 1) + t.view(n, 1, 1, 1) * a["b"].view(1, C, 1, 1)
            g = H // PATCH
            patches = x.reshape(n, C, g, PATCH, g, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(n, g * g, -1)
            zs = [torch.tanh(patches @ a[f"w{k}"] + t.view(n, 1, 1) * a[f"u{k}"]) for k in range(len(Z_DIMS))]
            return v, zs

    # float32 and float64 runs draw different noise (randn_like follows the images' dtype): each
    # run's noise is stored with it (noise32 float32, noise64 float64)
    for dtype, tag in ((torch.float32, "32"), (torch.float64, "64")):
        model = StandIn(out, dtype)
        loss_fn = SILoss(prediction="v", path_type="linear", weighting="uniform")
        x = torch.from_numpy(out["x"]).to(dtype)
        zs = [torch.from_numpy(out[f"z{k}"]).to(dtype) for k in range(len(Z_DIMS))]
        torch.manual_seed(SEED)
        denoising, proj = loss_fn(model, x, dict(y=None), zs=zs)
        # SILoss's own draws, replayed from the same seed: t = rand((B, 1, 1, 1)), then randn_like
        torch.manual_seed(SEED)
        t = torch.rand((B, 1, 1, 1))
        noise = torch.randn_like(x)
        seen_x, seen_t = model.seen
        assert torch.equal(seen_t, t.to(dtype).flatten())
        assert torch.allclose(seen_x, (1 - t.to(dtype)) * x + t.to(dtype) * noise, rtol=0, atol=0)
        out["t"] = t.flatten().numpy().astype(np.float32)
        out[f"noise{tag}"] = noise.numpy()
        out[f"denoising{tag}"] = denoising.detach().numpy().astype(np.float64)
        out[f"proj_loss{tag}"] = np.asarray(float(proj), np.float64)
        out[f"total{tag}"] = np.asarray(float(denoising.mean() + proj.mean() * 0.5), np.float64)
    return out


def dinov2_case(repa: str, dinov2_dir: str) -> dict[str, np.ndarray]:
    """REPA's DINOv2 path at a tiny width: load_encoders' timm resample of the 37x37 position grid
    to 16x16, preprocess_raw_image on uint8 256x256 images, forward_features' x_norm_patchtokens."""
    import timm
    import torch

    sys.path.insert(0, dinov2_dir)
    from functools import partial

    from dinov2.layers import MemEffAttention, NestedTensorBlock
    from dinov2.models import vision_transformer as vits

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dinov2"))
    from make_reference import randomize  # third_party/dinov2's seeded weights, same rules

    model = vits.DinoVisionTransformer(
        img_size=518,
        patch_size=14,
        embed_dim=32,
        depth=2,
        num_heads=2,
        mlp_ratio=4,
        block_fn=partial(NestedTensorBlock, attn_class=MemEffAttention),
        init_values=1.0,
        ffn_layer="mlp",
        block_chunks=0,
        num_register_tokens=0,
        interpolate_antialias=False,
        interpolate_offset=0.1,
    ).eval()
    rng = np.random.default_rng(SEED + 1)
    weights = randomize(model, rng)
    # load_encoders (utils.py), resolution 256: del head; pos_embed resampled to [16, 16]; head = Identity
    del model.head
    model.pos_embed.data = timm.layers.pos_embed.resample_abs_pos_embed(model.pos_embed.data, [16, 16])
    model.head = torch.nn.Identity()
    # train.py's preprocess_raw_image, read from the file and run as is
    with open(os.path.join(repa, "train.py")) as f:
        source = f.read()
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "preprocess_raw_image")
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    from torchvision.transforms import Normalize

    scope = {
        "torch": torch,
        "Normalize": Normalize,
        "IMAGENET_DEFAULT_MEAN": IMAGENET_DEFAULT_MEAN,
        "IMAGENET_DEFAULT_STD": IMAGENET_DEFAULT_STD,
        "CLIP_DEFAULT_MEAN": None,
        "CLIP_DEFAULT_STD": None,
    }
    exec(compile(ast.Module([fn], []), "train.py", "exec"), scope)
    images = rng.integers(0, 256, (2, 3, 256, 256), dtype=np.uint8)
    raw = torch.from_numpy(images).float()
    out = {f"weights/{k}": v for k, v in weights.items()}
    out["images"] = images
    out["pos_embed_resampled"] = model.pos_embed.data.numpy().astype(np.float32)
    for tag, dtype in (("32", torch.float32), ("64", torch.float64)):
        m = model.to(dtype)
        x = scope["preprocess_raw_image"](raw.to(dtype), "dinov2-vit-b")
        with torch.no_grad():
            z = m.forward_features(x)["x_norm_patchtokens"]
        out[f"tokens{tag}"] = z.numpy().astype(np.float32 if tag == "32" else np.float64)
        if tag == "64":
            idx = np.random.default_rng(SEED).choice(x.numel(), 4096, replace=False)
            out["preprocessed_index"] = idx
            out["preprocessed64"] = x.numpy().reshape(-1)[idx]
    return out


def _parser_from(path: str, function: str | None, extra: dict) -> argparse.ArgumentParser:
    """The file's own parser: ``function``'s body up to ``parse_args`` (train.py), or the
    ``__main__`` block's parser statements (generate.py), executed unmodified."""
    with open(path) as f:
        tree = ast.parse(f.read())
    if function is not None:
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
        body = fn.body
    else:
        main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
        body = main.body
    statements = [s for s in body if "parser" in ast.unparse(s) and "parse_args" not in ast.unparse(s)]
    scope = {"argparse": argparse, **extra}
    exec(compile(ast.Module(statements, []), path, "exec"), scope)
    return scope["parser"]


def args_case(repa: str) -> dict:
    """train.py's parse_args for the README's command (and bare, with only --exp-name), and
    generate.py's parser for the README's evaluation command."""
    sit_models = {f"SiT-{s}/{p}": None for s in ("S", "B", "L", "XL") for p in (2, 4, 8)}
    train = _parser_from(os.path.join(repa, "train.py"), "parse_args", {})
    readme_train = [
        "--report-to=wandb",
        "--allow-tf32",
        "--mixed-precision=fp16",
        "--seed=0",
        "--path-type=linear",
        "--prediction=v",
        "--weighting=uniform",
        "--model=SiT-XL/2",
        "--enc-type=dinov2-vit-b",
        "--proj-coeff=0.5",
        "--encoder-depth=8",
        "--output-dir=exps",
        "--exp-name=linear-dinov2-b-enc8",
        "--data-dir=[YOUR_DATA_PATH]",
    ]
    generate = _parser_from(os.path.join(repa, "generate.py"), None, {"SiT_models": sit_models})
    readme_generate = [
        "--model",
        "SiT-XL/2",
        "--num-fid-samples",
        "50000",
        "--ckpt",
        "YOUR_CHECKPOINT_PATH",
        "--path-type=linear",
        "--encoder-depth=8",
        "--projector-embed-dims=768",
        "--per-proc-batch-size=64",
        "--mode=sde",
        "--num-steps=250",
        "--cfg-scale=1.8",
        "--guidance-high=0.7",
    ]
    return {
        "train_readme_argv": readme_train,
        "train": vars(train.parse_args(readme_train)),
        "generate_readme_argv": readme_generate,
        "generate": vars(generate.parse_args(readme_generate)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repa", required=True, help="sihyun-yu/REPA checkout")
    parser.add_argument("--dinov2", required=True, help="facebookresearch/dinov2 checkout (holds dinov2/)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("XFORMERS_DISABLED", "1")
    import torch

    torch.set_num_threads(2)
    np.savez(os.path.join(args.out, "siloss.npz"), **siloss_case(args.repa))
    np.savez_compressed(os.path.join(args.out, "dinov2_repa.npz"), **dinov2_case(args.repa, args.dinov2))
    with open(os.path.join(args.out, "args.json"), "w") as f:
        json.dump(args_case(args.repa), f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
