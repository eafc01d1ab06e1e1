"""A tiny REPA-trained-shaped checkpoint and what REPA's own code does with it, for
``dew.convert_dit --source=repa`` (tests/test_convert_repa.py).

    /work/venvs/dit/bin/python third_party/repa/make_checkpoint.py --repa=/path/to/REPA \
        --out=third_party/repa

sihyun-yu/REPA's ``models/sit.py`` ``SiT`` is built small (depth 2, width 32, 2 heads, patch 2
on 8×8×4 latents, 1,000 classes as REPA's samplers' null label 1000 needs, ``encoder_depth=1``,
one projector to 16 features of hidden width 32), every parameter drawn at random (REPA
zero-initialises the adaLN and final layers, which would make the output 0), and saved as
REPA's ``train.py`` saves a checkpoint: ``torch.save({"model", "ema", "opt", "args", "steps"})``
(``repa_tiny_checkpoint.pt``; ``ema`` = ``model``, ``opt`` an Adam state_dict after no step,
``args`` an ``argparse.Namespace``).

``repa_tiny_outputs.npz`` holds, in REPA's convention (NCHW, t = 1 at the noise, the network's
first output the velocity dx/dt):

- ``x`` [3, 4, 8, 8], ``t`` [3], ``y`` [3]: points; ``out`` = ``model(x, t, y)[0]`` (eval mode);
- ``z`` [2, 4, 8, 8], ``labels`` [2]: the samplers' start noise and classes;
- ``ode/out``: ``samplers.euler_sampler(model, z, labels, num_steps=8, cfg_scale=1.8,
  guidance_high=0.7)`` (float64); ``sde/out``: ``samplers.euler_maruyama_sampler(model, z,
  labels, num_steps=8, cfg_scale=1.8, guidance_high=0.7, path_type="linear")`` and
  ``sde/noises`` [7, 2, 4, 8, 8] its ``torch.randn_like`` draws in order (recorded by wrapping
  ``torch.randn_like``, as make_samplers.py does).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys

import numpy as np
import torch

TINY = dict(
    input_size=8,
    patch_size=2,
    in_channels=4,
    hidden_size=32,
    decoder_hidden_size=32,
    depth=2,
    num_heads=2,
    num_classes=1000,
    class_dropout_prob=0.1,
    use_cfg=True,
    encoder_depth=1,
    z_dims=[16],
    projector_dim=32,
    fused_attn=False,  # train.py's block_kwargs (its defaults: plain attention, no qk_norm)
    qk_norm=False,
)
SEED = 20261
STEPS = 8
CFG = dict(cfg_scale=1.8, guidance_low=0.0, guidance_high=0.7)


def load(path: pathlib.Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def randomise(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Every trainable parameter at random (fan-in scaled; norms near 1, biases small)."""
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key == "pos_embed":
                continue
            if key.endswith("embedding_table.weight"):
                v = torch.randn(p.shape, generator=gen)
            elif p.ndim >= 2:
                v = torch.randn(p.shape, generator=gen) / np.sqrt(np.prod(p.shape[1:]))
            elif key.endswith("weight"):
                v = 1 + 0.1 * torch.randn(p.shape, generator=gen)
            else:
                v = 0.1 * torch.randn(p.shape, generator=gen)
            p.copy_(v)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repa", required=True, help="an extracted sihyun-yu/REPA checkout")
    parser.add_argument("--out", required=True)
    cli = parser.parse_args()
    root = pathlib.Path(cli.repa).resolve()
    sys.path.insert(0, str(root))
    models = load(root / "models" / "sit.py", "repa_sit")
    import samplers  # REPA's own samplers.py

    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = models.SiT(**TINY).eval()
    randomise(model, gen)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    args = argparse.Namespace(model="SiT-tiny", encoder_depth=1, proj_coeff=0.5, path_type="linear")
    state = model.state_dict()
    checkpoint = {"model": state, "ema": state, "opt": opt.state_dict(), "args": args, "steps": 1}
    out_dir = pathlib.Path(cli.out)
    torch.save(checkpoint, out_dir / "repa_tiny_checkpoint.pt")

    out: dict[str, np.ndarray] = {}
    x = torch.randn(3, 4, 8, 8, generator=gen)
    t = torch.tensor([0.05, 0.5, 0.9])
    y = torch.tensor([1, 500, 999])
    with torch.no_grad():
        v, zs = model(x, t, y)
    out.update(x=x.numpy(), t=t.numpy(), y=y.numpy(), out=v.numpy(), z0=zs[0].numpy())

    z = torch.randn(2, 4, 8, 8, generator=gen)
    labels = torch.tensor([3, 7])
    out.update(z=z.numpy(), labels=labels.numpy())
    with torch.no_grad():
        ode = samplers.euler_sampler(model, z.clone(), labels, num_steps=STEPS, **CFG)
    out["ode/out"] = ode.numpy()

    draws: list[np.ndarray] = []
    original = torch.randn_like

    def recording(a, *rest, **kw):
        e = original(a, *rest, **kw)
        draws.append(e.detach().clone().numpy())
        return e

    torch.manual_seed(SEED + 1)
    torch.randn_like = recording
    try:
        with torch.no_grad():
            sde = samplers.euler_maruyama_sampler(
                model, z.clone(), labels, num_steps=STEPS, path_type="linear", **CFG
            )
    finally:
        torch.randn_like = original
    out["sde/out"] = sde.numpy()
    out["sde/noises"] = np.stack(draws)
    out["meta_json"] = np.asarray(
        json.dumps({"config": TINY, "steps": STEPS, **CFG, "torch": torch.__version__})
    )
    np.savez_compressed(out_dir / "repa_tiny_outputs.npz", **out)
    print(f"wrote {out_dir}/repa_tiny_checkpoint.pt and repa_tiny_outputs.npz")


if __name__ == "__main__":
    main()
