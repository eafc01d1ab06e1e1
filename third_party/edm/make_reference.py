"""Golden vectors from NVlabs/edm's own networks, for dew's parity tests (run with PyTorch).

    /work/venv-torch/bin/python third_party/edm/make_reference.py --edm=/tmp/edm_ref

``--edm`` is an unmodified checkout of NVlabs/edm (its ``training/networks.py``). For each
configuration below this builds ``EDMPrecond(model_type=...)``, replaces every parameter by a
random draw of unit-scale activations (weights N(0, 1/fan_in), biases N(0, 0.1²), group-norm
weights 1 + N(0, 0.1²)) so that no layer is left at its near-zero initialisation, evaluates the
network in eval mode (no dropout) on fixed inputs, and writes ``<name>.npz`` holding

* ``param/<state-dict key>``: every parameter (float16: the random values are rounded to
  float16 before the network runs, so the stored values are exactly the float32 weights it ran
  with, at half the size) and buffer (float32), in PyTorch layout;
* ``x`` [B, C, H, W], ``sigma`` [B], ``class_labels`` [B, label_dim], ``augment_labels``;
* ``denoised``: ``EDMPrecond(x, sigma, class_labels, augment_labels=...)``;
* ``raw``: the inner network's F(c_in x, c_noise, ...) on the same inputs;
* ``num_parameters``: ``sum(p.numel() for p in net.parameters())``;
* ``config_json``: the keyword arguments, as JSON.

It also writes ``parameter_counts.json``: the reference's parameter count for larger
configurations (built, never run), which dew checks without building weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

CONFIGS = {
    # DDPM++ (EDM's --arch=ddpmpp at toy size), class-conditional, with augmentation labels.
    "songunet_ddpmpp": dict(
        img_resolution=8,
        img_channels=3,
        label_dim=10,
        model_type="SongUNet",
        model_channels=16,
        channel_mult=[1, 2],
        num_blocks=1,
        attn_resolutions=[4],
        augment_dim=9,
    ),
    # NCSN++ (--arch=ncsnpp): Fourier embedding, residual encoder, [1,3,3,1] filter.
    "songunet_ncsnpp": dict(
        img_resolution=8,
        img_channels=3,
        label_dim=10,
        model_type="SongUNet",
        model_channels=16,
        channel_mult=[1, 2, 2],
        num_blocks=1,
        attn_resolutions=[4],
        embedding_type="fourier",
        channel_mult_noise=2,
        encoder_type="residual",
        resample_filter=[1, 3, 3, 1],
    ),
    # The remaining SongUNet options: skip encoder and skip decoder, unconditional, 3 levels.
    "songunet_skip": dict(
        img_resolution=8,
        img_channels=1,
        label_dim=0,
        model_type="SongUNet",
        model_channels=8,
        channel_mult=[1, 2, 2],
        channel_mult_emb=2,
        num_blocks=2,
        attn_resolutions=[8, 2],
        encoder_type="skip",
        decoder_type="skip",
        resample_filter=[1, 3, 3, 1],
    ),
    # ADM: two heads at the 2x2 level (128 channels); attention asked for at 4x4 too, where 32
    # channels make zero heads of 64, i.e. no attention (the reference's rule).
    "dhariwalunet": dict(
        img_resolution=4,
        img_channels=3,
        label_dim=10,
        model_type="DhariwalUNet",
        model_channels=32,
        channel_mult=[1, 4],
        num_blocks=1,
        attn_resolutions=[4, 2],
        augment_dim=9,
    ),
}

COUNTS = {
    "issue_12_16x16": dict(
        img_resolution=16,
        img_channels=1,
        label_dim=10,
        model_type="SongUNet",
        model_channels=32,
        channel_mult=[1, 2, 2],
        num_blocks=2,
        attn_resolutions=[8],
    ),
    "digits_8x8": dict(
        img_resolution=8,
        img_channels=1,
        label_dim=10,
        model_type="SongUNet",
        model_channels=32,
        channel_mult=[1, 2],
        num_blocks=2,
        attn_resolutions=[4],
    ),
    "cifar10_ddpmpp_cond": dict(
        img_resolution=32,
        img_channels=3,
        label_dim=10,
        model_type="SongUNet",
        augment_dim=9,
        model_channels=128,
        channel_mult=[2, 2, 2],
        num_blocks=4,
        attn_resolutions=[16],
        dropout=0.13,
    ),
    "cifar10_ncsnpp_uncond": dict(
        img_resolution=32,
        img_channels=3,
        label_dim=0,
        model_type="SongUNet",
        augment_dim=9,
        model_channels=128,
        channel_mult=[2, 2, 2],
        num_blocks=4,
        embedding_type="fourier",
        channel_mult_noise=2,
        encoder_type="residual",
        resample_filter=[1, 3, 3, 1],
    ),
    "imagenet64_adm_cond": dict(
        img_resolution=64,
        img_channels=3,
        label_dim=1000,
        model_type="DhariwalUNet",
        model_channels=192,
        channel_mult=[1, 2, 3, 4],
    ),
}


def randomise(net, torch, gen) -> None:
    """Every parameter to a unit-scale random value (buffers keep their own)."""
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(fan_in))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            p.copy_(p.half().float())  # exactly representable in the stored float16


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--edm", required=True, help="an NVlabs/edm checkout")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    sys.path.insert(0, args.edm)
    import torch
    from training.networks import EDMPrecond

    torch.set_num_threads(2)
    for index, (name, kwargs) in enumerate(CONFIGS.items()):
        torch.manual_seed(index)
        gen = torch.Generator().manual_seed(1000 + index)
        net = EDMPrecond(**kwargs).eval()
        randomise(net, torch, gen)
        batch, res, ch = 4, kwargs["img_resolution"], kwargs["img_channels"]
        x = torch.randn([batch, ch, res, res], generator=gen)
        sigma = torch.tensor([0.002, 0.3, 2.5, 80.0])
        x = x * (sigma.reshape(-1, 1, 1, 1) ** 2 + 0.25).sqrt()  # noisy-data scale at each σ
        label_dim = kwargs["label_dim"]
        labels = torch.zeros([batch, max(label_dim, 1)])
        if label_dim:
            labels[torch.arange(3), torch.tensor([3, 0, 9])] = 1.0  # row 3 stays all zero: unconditional
        augment = None
        if kwargs.get("augment_dim"):
            augment = torch.randn([batch, kwargs["augment_dim"]], generator=gen)
        cls = labels if label_dim else None
        with torch.no_grad():
            denoised = net(x, sigma, cls, augment_labels=augment)
            s = sigma.reshape(-1, 1, 1, 1)
            c_in = 1 / (net.sigma_data**2 + s**2).sqrt()
            raw = net.model(c_in * x, (s.log() / 4).flatten(), class_labels=cls, augment_labels=augment)
        trainable = {k for k, _ in net.named_parameters()}
        arrays = {
            f"param/{k}": v.detach().numpy().astype(np.float16 if k in trainable else np.float32)
            for k, v in net.state_dict().items()
        }
        arrays.update(
            x=x.numpy(),
            sigma=sigma.numpy(),
            class_labels=labels.numpy(),
            denoised=denoised.numpy(),
            raw=raw.numpy(),
            num_parameters=np.asarray(sum(p.numel() for p in net.parameters())),
            config_json=np.asarray(json.dumps(kwargs)),
        )
        if augment is not None:
            arrays["augment_labels"] = augment.numpy()
        np.savez_compressed(os.path.join(args.out, f"{name}.npz"), **arrays)
        print(f"{name}: {int(arrays['num_parameters']):,} parameters, |raw| max {raw.abs().max():.3f}")

    counts = {}
    for name, kwargs in COUNTS.items():
        net = EDMPrecond(**kwargs)
        counts[name] = {"config": kwargs, "num_parameters": sum(p.numel() for p in net.parameters())}
        print(f"{name}: {counts[name]['num_parameters']:,} parameters")
    with open(os.path.join(args.out, "parameter_counts.json"), "w") as f:
        json.dump(counts, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
