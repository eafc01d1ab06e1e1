"""A checkpoint saved exactly as facebookresearch/DiT's ``train.py`` saves one, and the same
weights as the published ``DiT-XL-2-256x256.pt`` is laid out (a bare state dict), for a tiny
random DiT; with the reference's output of its EMA network on fixed inputs.

    /work/venvs/dit/bin/python third_party/dit/make_train_checkpoint.py --dit=/path/to/DiT \
        --out=third_party/dit

The network is DiT's ``models.py`` ``DiT`` at a tiny custom size (``NETWORK``), its weights
redrawn as ``make_reference.py`` redraws them. Then ``train.py``'s own code runs, unmodified:
its ``requires_grad`` and ``update_ema`` functions (executed from the file), its optimizer
(``torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)``), ``update_ema(ema, model,
decay=0)``, ``model.train()``, and two training steps of its loop body (``diffusion =
create_diffusion(timestep_respacing="")`` from the checkout's ``diffusion`` package,
``training_losses(model, x, t, dict(y=y))["loss"].mean()``, ``zero_grad``/``backward``/``step``,
``update_ema(ema, model)``) on random latents; ``args`` is what ``train.py``'s parser returns
for ``--data-path=DATA --model=DiT-S/2 --num-classes=10`` (the parser offers only the published
sizes: the record says DiT-S/2 while the weights are the tiny network's; dew's converter reads
the weights, never ``args``). The checkpoint is ``train.py``'s dict
``{"model": ..., "ema": ..., "opt": opt.state_dict(), "args": args}``, ``torch.save``d.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_configs import main_block, run_parser
from make_reference import load, randomise

NETWORK = dict(
    input_size=8, patch_size=2, in_channels=4, hidden_size=16, depth=2, num_heads=2, num_classes=10
)
SEED = 31


def train_functions(path: Path) -> dict:
    """``requires_grad`` and ``update_ema`` from ``train.py``'s source, executed as written."""
    tree = ast.parse(path.read_text())
    wanted = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("requires_grad", "update_ema")
    ]
    namespace = {"torch": torch, "OrderedDict": OrderedDict}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dit", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    cli = parser.parse_args()
    torch.set_num_threads(2)
    sys.path.insert(0, str(cli.dit))
    from diffusion import create_diffusion  # the checkout's own package

    models = load(cli.dit / "models.py", "dit_models")
    train = train_functions(cli.dit / "train.py")
    args = argparse.Namespace(
        **run_parser(
            main_block(str(cli.dit / "train.py")),
            {"DiT_models": models.DiT_models},
            ["--data-path=DATA", "--model=DiT-S/2", "--num-classes=10"],
        )
    )
    torch.manual_seed(SEED)
    model = models.DiT(**NETWORK, class_dropout_prob=0.1, learn_sigma=True)
    randomise(model, SEED)
    ema = copy.deepcopy(model)
    train["requires_grad"](ema, False)
    diffusion = create_diffusion(timestep_respacing="")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    train["update_ema"](ema, model, decay=0)
    model.train()
    ema.eval()
    g = torch.Generator().manual_seed(SEED + 1)
    for _ in range(2):  # train.py's loop body, latents already encoded
        x = torch.randn(4, NETWORK["in_channels"], 8, 8, generator=g)
        y = torch.randint(0, NETWORK["num_classes"], (4,), generator=g)
        t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],), generator=g)
        loss = diffusion.training_losses(model, x, t, dict(y=y))["loss"].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        train["update_ema"](ema, model)
    checkpoint = {"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "args": args}
    torch.save(checkpoint, cli.out / "dit_train_checkpoint.pt")
    torch.save(ema.state_dict(), cli.out / "dit_published_layout.pt")  # DiT-XL-2-256x256.pt's layout

    rng = np.random.default_rng(SEED)
    inputs = {
        "x": rng.standard_normal((3, NETWORK["in_channels"], 8, 8)).astype(np.float32),
        "t": np.array([0, 421.5, 999], np.float32),
        "y": np.array([2, 7, NETWORK["num_classes"]], np.int64),  # one null-class label
    }
    model.eval()
    with torch.no_grad():
        args_t = [torch.from_numpy(inputs[k]) for k in ("x", "t", "y")]
        out_ema, out_model = ema(*args_t).numpy(), model(*args_t).numpy()
    np.savez(
        cli.out / "dit_train_checkpoint.npz",
        **inputs,
        out_ema=out_ema,
        out_model=out_model,
        config_json=np.asarray(json.dumps({**NETWORK, "learn_sigma": True, "class_dropout_prob": 0.1})),
        opt_keys=np.asarray(sorted(opt.state_dict()["param_groups"][0])),
        args_json=np.asarray(json.dumps(vars(args))),
    )
    count = sum(p.numel() for p in model.parameters())
    print(f"wrote {cli.out}/dit_train_checkpoint.pt, dit_published_layout.pt, .npz ({count} parameters)")


if __name__ == "__main__":
    main()
