"""Golden outputs of NVlabs/edm2's own ``Precond`` on random weights (run with PyTorch).

    /work/venv-torch/bin/python third_party/edm2/make_network_reference.py --edm2=/work/ref/edm2

``--edm2`` is an unmodified checkout of NVlabs/edm2 (commit 4bf8162f601bcc09472ce8a32dd0cbe8889dc8fc
was used). This builds ``training.networks_edm2.Precond`` at a tiny size (``CONFIG`` below: 16×16×3,
10 classes, channels 16/32, one block per level, attention at 8×8 with 8 channels per head, so
every kind of block and the attention path run), draws every MPConv weight N(0, 1) (its own
initialisation) and every gain (``emb_gain``, ``out_gain``; zero at initialisation, which would make
F ≡ 0) from U(0.5, 1.5), rounds all of them to float16 so the stored values are exactly those the
network ran with, and writes ``network_reference.npz`` holding

* ``param/<state-dict key>``: every parameter (float16) and buffer (float32), PyTorch layout;
* ``x`` [B, C, H, W], ``sigma`` [B], ``class_labels`` [B, 10] (one row all zeros);
* ``eval/denoised``, ``eval/logvar``: ``net.eval()(x, sigma, class_labels, return_logvar=True)``;
* ``train/denoised``, ``train/logvar``: the same in ``net.train()`` mode (dropout is 0), which
  also re-normalises the stored weights in place (forced weight normalisation, Eq. 66);
* ``train_weight/<key>``: the MPConv weights of at most 4,096 elements after that training forward
  (float32);
* ``config_json``: ``CONFIG`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

CONFIG = dict(
    img_resolution=16,
    img_channels=3,
    label_dim=10,
    use_fp16=False,
    logvar_channels=16,
    model_channels=16,
    channel_mult=[1, 2],
    num_blocks=1,
    attn_resolutions=[8],
    channels_per_head=8,
    dropout=0.0,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edm2", default="/work/ref/edm2", help="an NVlabs/edm2 checkout")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "network_reference.npz"))
    args = parser.parse_args()
    sys.dont_write_bytecode = True
    sys.path.insert(0, os.path.abspath(args.edm2))
    import torch
    from training.networks_edm2 import Precond

    torch.manual_seed(0)
    net = Precond(**CONFIG)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("gain"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen))
            p.copy_(p.half().float())
    out = {
        f"param/{k}": (v.half() if k.endswith(("weight", "gain")) else v).numpy()
        for k, v in net.state_dict().items()
    }
    rng = np.random.default_rng(2)
    batch = 4
    x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float16).astype(np.float32)
    sigma = np.array([0.02, 0.4, 2.5, 40.0], np.float32)
    labels = np.zeros((batch, 10), np.float32)
    labels[np.arange(batch - 1), [3, 7, 0]] = 1.0
    out.update(x=x, sigma=sigma, class_labels=labels, config_json=np.array(json.dumps(CONFIG)))
    args_t = (torch.from_numpy(x), torch.from_numpy(sigma), torch.from_numpy(labels))
    with torch.no_grad():
        for mode in ("eval", "train"):
            net.train(mode == "train")
            denoised, logvar = net(*args_t, return_logvar=True)
            out[f"{mode}/denoised"] = denoised.numpy()
            out[f"{mode}/logvar"] = logvar.numpy()
    for k, v in net.state_dict().items():
        if k.endswith("weight") and v.numel() <= 4096:  # the small ones, to keep the file small
            out[f"train_weight/{k}"] = v.numpy().copy()
    np.savez_compressed(args.out, **out)
    print(f"{args.out}: {sum(p.numel() for p in net.parameters()):,d} parameters", flush=True)


if __name__ == "__main__":
    main()
