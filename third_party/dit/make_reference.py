"""Golden outputs of facebookresearch/DiT, willisma/SiT and sihyun-yu/REPA's own ``models.py`` on
random weights, for dew's DiT/SiT port (tests/test_dit.py, tests/test_dit_checkpoint.py).

Run with the references' checkouts as arguments (their code is not part of dew):

    /work/venvs/dit/bin/python third_party/dit/make_reference.py \
        --dit=/path/to/DiT --sit=/path/to/SiT --repa=/path/to/REPA --out=third_party/dit

Every parameter except the fixed ``pos_embed`` is redrawn (the references zero-initialise the
adaLN and final layers, which would hide bugs): weights N(0, 1/fan_in), biases N(0, 0.1²), the
label table N(0, 1), norm weights 1 + N(0, 0.1²), each rounded to float16 (exact in float32).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # LightningDiT's @torch.compile runs eagerly
import torch

TINY = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=4, num_classes=10)
BATCH = 4


def load(path: Path, name: str):
    """Import ``path`` (a reference's ``models.py``) as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def randomise(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key == "pos_embed":
                continue
            if key.endswith("embedding_table.weight"):
                v = torch.randn(p.shape, generator=g)
            elif p.ndim >= 2:
                v = torch.randn(p.shape, generator=g) / np.sqrt(np.prod(p.shape[1:]))
            elif key.endswith("weight"):  # 1-D: a norm's scale
                v = 1 + 0.1 * torch.randn(p.shape, generator=g)
            else:
                v = 0.1 * torch.randn(p.shape, generator=g)
            p.copy_(v.half().float())


def state_arrays(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def half(key: str, value: np.ndarray) -> np.ndarray:
    """A redrawn weight as float16 (exact); the fixed buffers (pos_embed, rotary tables) as they are."""
    fixed = key == "pos_embed" or key.startswith("feat_rope.")
    assert fixed or np.array_equal(value.astype(np.float16).astype(value.dtype), value), key
    return value if fixed else value.astype(np.float16)


def inputs(seed: int, continuous_t: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, TINY["in_channels"], 8, 8)).astype(np.float32)
    t = (
        np.array([0.0, 0.3, 0.999, 0.05], np.float32)
        if continuous_t
        else np.array([0, 250.5, 999, 17], np.float32)
    )
    y = np.array([0, 3, TINY["num_classes"], 9], np.int64)  # one null-class label
    return {"x": x, "t": t, "y": y}


def run(model, x, t, y, **kw):
    with torch.no_grad():
        return model(torch.from_numpy(x), torch.from_numpy(t), torch.from_numpy(y), **kw)


def cfg_case(model, data: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    x = np.concatenate([data["x"][:2], data["x"][2:]], axis=0)  # the second half is ignored
    y = np.array([1, 7, TINY["num_classes"], TINY["num_classes"]], np.int64)
    t = np.concatenate([data["t"][:2], data["t"][:2]])
    with torch.no_grad():
        out = model.forward_with_cfg(torch.from_numpy(x), torch.from_numpy(t), torch.from_numpy(y), scale)
    return {"cfg_x": x, "cfg_t": t, "cfg_y": y, "cfg_scale": np.float32(scale), "cfg_out": out.numpy()}


def make_dit_like(
    models, cls_name: str, seed: int, continuous_t: bool, out: Path, stem: str, with_params: bool
) -> dict:
    torch.manual_seed(seed)
    model = getattr(models, cls_name)(**TINY, class_dropout_prob=0.1, learn_sigma=True).eval()
    randomise(model, seed)
    data = inputs(seed, continuous_t)
    result = dict(data)
    result["out"] = run(model, data["x"], data["t"], data["y"]).numpy()
    drop = np.array([1, 0, 0, 1], np.int64)
    # force_drop_ids through the reference's own token_drop, then its forward on the dropped labels:
    with torch.no_grad():
        y_dropped = model.y_embedder.token_drop(torch.from_numpy(data["y"]), torch.from_numpy(drop))
    result["force_drop_ids"] = drop
    result["y_dropped"] = y_dropped.numpy()
    result["out_dropped"] = run(model, data["x"], data["t"], y_dropped.numpy()).numpy()
    result.update(cfg_case(model, data, 4.0))
    result["config_json"] = np.array(json.dumps({**TINY, "class_dropout_prob": 0.1, "learn_sigma": True}))
    result["num_parameters"] = np.int64(sum(p.numel() for p in model.parameters()))
    if with_params:  # float16: exact (randomise rounds them); pos_embed float32
        result.update({f"param/{k}": half(k, v) for k, v in state_arrays(model).items()})
    np.savez(out / f"{stem}.npz", **result)
    return state_arrays(model)


def make_repa(models, qk_norm: bool, seed: int, out: Path, stem: str) -> None:
    torch.manual_seed(seed)
    config = dict(
        TINY,
        decoder_hidden_size=TINY["hidden_size"],
        encoder_depth=1,
        class_dropout_prob=0.1,
        z_dims=[16, 24],
        projector_dim=32,
        qk_norm=qk_norm,
    )
    model = models.SiT(**config).eval()
    randomise(model, seed)
    data = inputs(seed, continuous_t=True)
    with torch.no_grad():
        x, zs = run(model, data["x"], data["t"], data["y"])
    result = dict(data, out=x.numpy(), z0=zs[0].numpy(), z1=zs[1].numpy())
    result["config_json"] = np.array(json.dumps(config))
    result["num_parameters"] = np.int64(sum(p.numel() for p in model.parameters()))
    result.update({f"param/{k}": half(k, v) for k, v in state_arrays(model).items()})
    np.savez(out / f"{stem}.npz", **result)


def make_lightningdit(root: Path, seed: int, out: Path, stem: str, **options) -> None:
    """LightningDiT (hustvl/LightningDiT ``models/lightningdit.py``) with the options dew offers;
    weights stored as float16 (exact: ``randomise`` rounds them), its rotary buffers as float32."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    models = importlib.import_module("models.lightningdit")
    torch.manual_seed(seed)
    config = dict(TINY, class_dropout_prob=0.1, learn_sigma=False, **options)
    model = models.LightningDiT(**config).eval()
    randomise(model, seed)
    data = inputs(seed, continuous_t=True)
    result = dict(data, out=run(model, data["x"], data["t"], data["y"]).numpy())
    result["config_json"] = np.array(json.dumps(config))
    result["num_parameters"] = np.int64(sum(p.numel() for p in model.parameters()))
    result.update({f"param/{k}": half(k, v) for k, v in state_arrays(model).items()})
    np.savez(out / f"{stem}.npz", **result)


def counts(dit, sit, repa) -> dict:
    """Parameter counts of every published size at 256x256 (32x32 latents), from the references."""
    table: dict[str, dict[str, int]] = {}
    with torch.device("meta"):
        for registry in (dit.DiT_models, sit.SiT_models):
            for name, build in registry.items():
                model = build(input_size=32, num_classes=1000)
                table[name] = {
                    "total": sum(p.numel() for p in model.parameters()),
                    "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                }
        for name in ("SiT-B/2", "SiT-L/2", "SiT-XL/2"):  # REPA's train.py defaults
            model = repa.SiT_models[name](
                input_size=32,
                num_classes=1000,
                encoder_depth=8,
                z_dims=[768],
                projector_dim=2048,
                use_cfg=True,
                fused_attn=True,
                qk_norm=False,
            )
            table[f"REPA {name}"] = {
                "total": sum(p.numel() for p in model.parameters()),
                "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            }
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dit", type=Path, required=True)
    parser.add_argument("--sit", type=Path, required=True)
    parser.add_argument("--repa", type=Path, required=True)
    parser.add_argument("--lightningdit", type=Path, help="hustvl/LightningDiT checkout (optional)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    torch.set_num_threads(2)
    dit = load(args.dit / "models.py", "dit_models")
    sit = load(args.sit / "models.py", "sit_models")
    repa = load(args.repa / "models" / "sit.py", "repa_sit")
    state = make_dit_like(dit, "DiT", 0, False, args.out, "dit_tiny", with_params=False)
    make_dit_like(sit, "SiT", 1, True, args.out, "sit_tiny", with_params=True)
    make_repa(repa, False, 2, args.out, "repa_tiny")
    if args.lightningdit:
        every = dict(use_qknorm=True, use_swiglu=True, use_rope=True, use_rmsnorm=True)
        make_lightningdit(args.lightningdit, 4, args.out, "lightningdit_tiny", **every)
        layernorm_qk = dict(use_qknorm=True, use_swiglu=False, use_rope=True, use_rmsnorm=False)
        make_lightningdit(args.lightningdit, 5, args.out, "lightningdit_tiny_layernorm_qk", **layernorm_qk)

    # The tiny DiT's weights as the reference's train.py saves a checkpoint ({"model", "ema", ...})
    # and as a plain state dict (the published DiT-XL-2-256x256.pt layout), .pt and .npz.
    ema = {k: torch.from_numpy(v) for k, v in state.items()}
    g = torch.Generator().manual_seed(9)
    model_sd = {
        k: (v + 0.5 * torch.randn(v.shape, generator=g) if k != "pos_embed" else v) for k, v in ema.items()
    }
    torch.save({"model": model_sd, "ema": ema}, args.out / "dit_tiny_checkpoint.pt")
    np.savez(args.out / "dit_tiny_state_dict.npz", **state)
    (args.out / "parameter_counts.json").write_text(json.dumps(counts(dit, sit, repa), indent=1) + "\n")


if __name__ == "__main__":
    main()
