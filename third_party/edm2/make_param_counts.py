"""Parameter counts of NVlabs/edm2's ``Precond`` for every ``train_edm2.py`` preset (run with PyTorch).

    /work/venv-torch/bin/python third_party/edm2/make_param_counts.py --edm2=/work/ref/edm2

``--edm2`` is an unmodified checkout of NVlabs/edm2 (commit 4bf8162f601bcc09472ce8a32dd0cbe8889dc8fc
was used). For each entry of its ``train_edm2.config_presets`` this builds
``training.networks_edm2.Precond`` on PyTorch's ``meta`` device (shapes only, no memory) with the
network keyword arguments ``setup_training_config`` passes (``model_channels=channels``,
``dropout``, ``use_fp16=True``) and the interface ``training_loop`` derives from the data:
ImageNet-512 latents (64×64×4, ``img512`` presets) or ImageNet-64 pixels (64×64×3, ``img64``), both
with 1000 classes. It writes ``param_counts.json``: per preset the interface, the network kwargs,
``num_parameters`` (``sum(p.numel() for p in net.parameters())``), ``num_buffers`` (the MPFourier
``freqs``/``phases``) and ``shapes`` (every state_dict entry's shape, by name).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

INTERFACES = {
    "img512": dict(img_resolution=64, img_channels=4, label_dim=1000),
    "img64": dict(img_resolution=64, img_channels=3, label_dim=1000),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edm2", default="/work/ref/edm2", help="an NVlabs/edm2 checkout")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "param_counts.json"))
    args = parser.parse_args()
    sys.dont_write_bytecode = True
    sys.path.insert(0, os.path.abspath(args.edm2))
    import torch
    import train_edm2
    from training.networks_edm2 import Precond

    counts = {}
    for preset, opts in train_edm2.config_presets.items():
        interface = INTERFACES[preset.split("-")[1]]
        kwargs = dict(model_channels=opts.channels, dropout=opts.dropout, use_fp16=True)
        with torch.device("meta"):
            net = Precond(**interface, **kwargs)
        counts[preset] = {
            "interface": interface,
            "network_kwargs": kwargs,
            "num_parameters": sum(p.numel() for p in net.parameters()),
            "num_buffers": sum(b.numel() for b in net.buffers()),
            "shapes": {k: list(v.shape) for k, v in net.state_dict().items()},
        }
        print(f"{preset:18s} {counts[preset]['num_parameters']:>12,d} parameters", flush=True)
    with open(args.out, "w") as f:
        json.dump(counts, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
