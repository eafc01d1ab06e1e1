"""Golden samples of NVlabs/edm2's ``generate_images.py`` ``edm_sampler`` with autoguidance, on
random-weight networks (run with PyTorch).

    /work/venv-torch/bin/python third_party/edm2/make_autoguidance_reference.py --edm2=/work/ref/edm2

``--edm2`` is an unmodified checkout of NVlabs/edm2 (commit 4bf8162f601bcc09472ce8a32dd0cbe8889dc8fc
was used). Two ``training.networks_edm2.Precond`` at 8×8×3 with 10 classes: the main network
(``MAIN``: channels 16/32, attention at 4×4) and a smaller guide (``GUIDE``: channels 8/16), as
the reference guides its S/XXL networks with an XS/M one. Weights as in
``make_network_reference.py`` (MPConv N(0, 1), gains U(0.5, 1.5), float16-rounded). For each
guidance weight in ``GUIDANCE`` (1 = unguided; 1.7, 2.1, 2.45: the weights of the reference's
``*-autog-*`` presets) it runs ``edm_sampler(net, noise, labels, gnet, guidance=w)`` with the
sampler's defaults, which every ``generate_images.py`` preset uses (32 steps, σ ∈ [0.002, 80],
ρ = 7, no churn). Writes ``autoguidance_reference.npz``: ``main/<key>``, ``guide/<key>``
(state dicts), ``noise`` [B, C, H, W], ``labels`` [B, 10], ``guidance`` [G], ``samples`` [G, B,
C, H, W], ``main_json``/``guide_json`` (the keyword arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

COMMON = dict(img_resolution=8, img_channels=3, label_dim=10, use_fp16=False, logvar_channels=8, num_blocks=1)
MAIN = dict(COMMON, model_channels=16, channel_mult=[1, 2], attn_resolutions=[4], channels_per_head=8)
GUIDE = dict(COMMON, model_channels=8, channel_mult=[1, 2], attn_resolutions=[4], channels_per_head=8)
GUIDANCE = [1.0, 1.7, 2.1, 2.45]


def _random_weights(net, torch, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("gain"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen))
            p.copy_(p.half().float())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edm2", default="/work/ref/edm2", help="an NVlabs/edm2 checkout")
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "autoguidance_reference.npz")
    )
    args = parser.parse_args()
    sys.dont_write_bytecode = True
    sys.path.insert(0, os.path.abspath(args.edm2))
    import torch
    from generate_images import edm_sampler
    from training.networks_edm2 import Precond

    torch.manual_seed(0)
    nets = {"main": Precond(**MAIN).eval(), "guide": Precond(**GUIDE).eval()}
    out = {}
    for i, (role, net) in enumerate(nets.items()):
        _random_weights(net, torch, 10 + i)
        for k, v in net.state_dict().items():
            out[f"{role}/{k}"] = (v.half() if k.endswith(("weight", "gain")) else v).numpy()
    rng = np.random.default_rng(4)
    batch = 3
    noise = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
    labels = np.zeros((batch, 10), np.float32)
    labels[np.arange(batch), [1, 5, 9]] = 1.0
    samples = []
    with torch.no_grad():
        for w in GUIDANCE:
            x = edm_sampler(
                nets["main"], torch.from_numpy(noise), torch.from_numpy(labels), nets["guide"], guidance=w
            )
            samples.append(x.numpy())
    out.update(
        noise=noise,
        labels=labels,
        guidance=np.asarray(GUIDANCE, np.float32),
        samples=np.stack(samples),
        main_json=np.array(json.dumps(MAIN)),
        guide_json=np.array(json.dumps(GUIDE)),
    )
    np.savez_compressed(args.out, **out)
    print(f"{args.out}: samples {np.stack(samples).shape}", flush=True)


if __name__ == "__main__":
    main()
