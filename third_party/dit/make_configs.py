"""What facebookresearch/DiT's (or willisma/SiT's) own code resolves for training and for the
published FID's sampling, as JSON: the configurations ``experiments/dit.py`` and
``experiments/sit.py`` are checked against (``tests/test_dit_configs.py``).

    python third_party/dit/make_configs.py --ref=dit --checkout=/path/to/DiT \
        --out=third_party/dit/configs.json
    python third_party/dit/make_configs.py --ref=sit --checkout=/path/to/SiT \
        --out=third_party/sit/configs.json

Nothing is re-typed from the references:

* ``train``: for every entry of the reference's model table (``DiT_models`` / ``SiT_models``),
  ``vars(args)`` of ``train.py``'s own ``__main__`` block run with ``--data-path=DATA
  --model=<name>`` (the block's source is executed with ``main`` replaced by a function that
  records its ``args``; SiT's ``parse_transport_args`` comes from its ``train_utils.py``);
* ``sample``: ``vars(args)`` of ``sample_ddp.py``'s ``__main__`` block (the FID sampler), with no
  flags for DiT (its defaults are the published 2.27: cfg 1.5, 250 steps) and ``SDE
  --cfg-scale=1.5`` for SiT (the published 2.06: the paper's SDE with cfg 1.5);
* ``literals``: the constants ``train.py`` hard-codes, read from its syntax tree: the keyword
  arguments of ``torch.optim.AdamW(...)``, the latent scale in ``.mul_(<scale>)``, ``update_ema``'s
  default ``decay`` and the ``decay`` of its first call (the copy EMA starts from), the keyword
  arguments of ``create_diffusion(...)`` / ``create_transport(...)``'s call;
* ``models``: each table entry built by the reference's own constructor on PyTorch's ``meta``
  device at 32x32 latents: depth, hidden size, heads, patch size, ``learn_sigma``,
  the label embedder's dropout probability, the input and output channels;
* ``AdamW_defaults``: ``torch.optim.AdamW``'s signature defaults (betas, eps, ...);
  ``create_diffusion_defaults`` (DiT only): ``diffusion.create_diffusion``'s;
* ``sit_transport`` (SiT only): ``create_transport``'s resolved ``train_eps``/``sample_eps`` for
  the defaults (the ``Transport`` object's own attributes).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys


def main_block(path: str) -> str:
    """The source of the ``if __name__ == "__main__":`` block of the file at ``path``."""
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return "\n".join(ast.unparse(n) for n in node.body)
    raise SystemExit(f"{path}: no __main__ block")


def run_parser(source: str, namespace: dict, argv: list[str]) -> dict:
    """vars(args) the block's parser produces for ``argv`` (``main`` records it)."""
    seen: dict = {}

    def record(*args):
        seen["args"] = args[-1]

    old = sys.argv
    sys.argv = ["prog", *argv]
    try:
        exec(source, {**namespace, "main": record, "argparse": argparse, "sys": sys})
    finally:
        sys.argv = old
    return {k: v for k, v in vars(seen["args"]).items()}


def literals(path: str) -> dict:
    """The constants train.py hard-codes (module docstring)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    out: dict = {"update_ema_calls": []}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "update_ema":
            names = [a.arg for a in node.args.args]
            tail = names[len(names) - len(node.args.defaults) :]
            defaults = dict(zip(tail, node.args.defaults, strict=True))
            out["update_ema_default_decay"] = ast.literal_eval(defaults["decay"])
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name.endswith("AdamW"):
            out["AdamW"] = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        elif name.endswith(".mul_") and node.args and isinstance(node.args[0], ast.Constant):
            out["latent_scale"] = node.args[0].value
        elif name == "update_ema":
            decay = [ast.literal_eval(k.value) for k in node.keywords if k.arg == "decay"]
            out["update_ema_calls"].append(decay[0] if decay else None)
        elif name in ("create_diffusion", "create_transport"):
            out[name] = {k.arg: ast.unparse(k.value) for k in node.keywords} | {
                f"arg{i}": ast.unparse(a) for i, a in enumerate(node.args)
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref", choices=("dit", "sit"), required=True)
    parser.add_argument("--checkout", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit", help="the checkout's commit (a git archive has no .git)")
    args = parser.parse_args()
    root = os.path.abspath(args.checkout)
    sys.path.insert(0, root)
    import models
    import torch

    table = models.DiT_models if args.ref == "dit" else models.SiT_models
    namespace: dict = {f"{args.ref.upper()[0]}{args.ref[1:]}_models": table}
    namespace["DiT_models" if args.ref == "dit" else "SiT_models"] = table
    if args.ref == "sit":
        import train_utils

        namespace.update(
            {k: getattr(train_utils, k) for k in ("parse_transport_args", "parse_ode_args", "parse_sde_args")}
        )
    train_src = main_block(os.path.join(root, "train.py"))
    sample_src = main_block(os.path.join(root, "sample_ddp.py"))
    train = {
        name: run_parser(train_src, namespace, ["--data-path=DATA", f"--model={name}"]) for name in table
    }
    sample_argv = [] if args.ref == "dit" else ["SDE", "--cfg-scale=1.5"]
    if args.ref == "sit":
        sys.argv = ["prog", *sample_argv]  # the block reads sys.argv[1] (the mode) itself
    sample = run_parser(sample_src, namespace, sample_argv)
    built = {}
    with torch.device("meta"):
        for name, make in table.items():
            net = make(input_size=32, num_classes=1000)
            built[name] = {
                "depth": len(net.blocks),
                "hidden_size": int(net.x_embedder.proj.out_channels),
                "num_heads": int(net.num_heads),
                "patch_size": int(net.patch_size),
                "learn_sigma": bool(net.learn_sigma),
                "in_channels": int(net.in_channels),
                "out_channels": int(net.out_channels),
                "class_dropout_prob": float(net.y_embedder.dropout_prob),
            }
    record = {
        "commit": args.commit
        or subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "train": train,
        "sample": sample,
        "sample_argv": sample_argv,
        "literals": literals(os.path.join(root, "train.py")),
        "models": built,
    }
    import inspect

    def defaults(fn) -> dict:
        return {
            k: v.default
            for k, v in inspect.signature(fn).parameters.items()
            if v.default is not inspect.Parameter.empty
        }

    record["AdamW_defaults"] = defaults(torch.optim.AdamW)
    if args.ref == "dit":
        from diffusion import create_diffusion

        record["create_diffusion_defaults"] = defaults(create_diffusion)
    if args.ref == "sit":
        from transport import create_transport

        made = create_transport()
        record["sit_transport"] = {
            "train_eps": float(made.train_eps),
            "sample_eps": float(made.sample_eps),
            "path_type": str(made.path_sampler.__class__.__name__),
            "model_type": str(made.model_type),
            "loss_type": str(made.loss_type),
        }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    print(f"wrote {args.out}: {len(train)} models")


if __name__ == "__main__":
    main()
