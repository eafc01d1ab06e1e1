"""Network snapshots written by NVlabs/edm's own training-loop code, for dew's pickle import test.

    /work/venv-torch/bin/python third_party/edm/make_snapshot_reference.py --edm=/tmp/edm_ref

``--edm`` is an unmodified checkout of NVlabs/edm. For each entry of ``SNAPSHOTS`` this runs the
code path by which ``train.py`` and ``training/training_loop.py`` build and save a network:

* ``network_kwargs`` / ``loss_kwargs`` / ``augment_kwargs`` / ``dataset_kwargs`` as ``train.py``
  fills them for the ``--arch`` named (at a tiny size: ``--cbase``, ``--cres`` and the network's
  ``num_blocks`` / ``attn_resolutions`` set small);
* ``dnnlib.util.construct_class_by_name(**network_kwargs, **interface_kwargs)`` (the classes of
  ``training/networks.py`` carry ``torch_utils.persistence``'s decorator, which records the
  constructor arguments and embeds the module source when pickled), the loss and the augmentation
  pipe the same way, and ``ema = copy.deepcopy(net).eval().requires_grad_(False)``;
* the EMA's parameters redrawn at unit activation scale and rounded to float16
  (``make_reference.randomise``), so that no layer sits at its near-zero initialisation;
* the snapshot block of ``training_loop.py``: ``data = dict(ema=..., loss_fn=..., augment_pipe=...,
  dataset_kwargs=dict(dataset_kwargs))``, each module deep-copied, ``eval()``,
  ``requires_grad_(False)``, ``misc.check_ddp_consistency``, ``.cpu()``, then ``pickle.dump``.

The snapshot is written as ``<name>.pkl``; it is then loaded back with the reference's own
``pickle.load`` (which executes the embedded source, as NVlabs/edm's ``generate.py`` does) and the
loaded ``ema`` is evaluated on fixed inputs, written to ``<name>.npz``:

* ``x`` [B, C, H, W], ``sigma`` [B], ``class_labels`` [B, label_dim] (the last row all zero);
* ``denoised``: ``ema(x, sigma, class_labels)`` (no augmentation labels, as sampling passes);
* ``init_kwargs_json``: ``ema.init_kwargs`` as JSON; ``model_init_kwargs_json``: the inner
  network's; ``num_parameters``.

``tensor-layouts.pkl`` / ``.npz`` (``write_tensor_layouts``) check the tensor reader on layouts
and dtypes the tiny networks do not have.

The ``dataset_kwargs`` name the data set ``train.py --data=...`` would have opened; nothing is
read from it (no training step runs: the weights are random).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# Shared by every entry: train.py's dataset_kwargs for --data=<digits archive> --cond=1, with the
# resolution and size it records after opening the data set (8x8, 1 channel, 10 classes: the shape
# of dew's embedded digits, so the converted run opens a data set dew has without a download).
DATASET_KWARGS = dict(
    class_name="training.dataset.ImageFolderDataset",
    path="datasets/digits-8x8.zip",
    use_labels=True,
    xflip=False,
    cache=True,
    resolution=8,
    max_size=1617,
)
INTERFACE_KWARGS = dict(img_resolution=8, img_channels=1, label_dim=10)

SNAPSHOTS = {
    # --arch=ddpmpp --precond=edm --augment=0.12 --dropout=0.13 (CIFAR-10's settings), tiny.
    "network-snapshot-tiny": dict(
        network_kwargs=dict(
            class_name="training.networks.EDMPrecond",
            model_type="SongUNet",
            embedding_type="positional",
            encoder_type="standard",
            decoder_type="standard",
            channel_mult_noise=1,
            resample_filter=[1, 1],
            model_channels=16,
            channel_mult=[1, 2],
            num_blocks=1,
            attn_resolutions=[4],
            augment_dim=9,
            dropout=0.13,
            use_fp16=False,
        ),
        loss_kwargs=dict(class_name="training.loss.EDMLoss"),
        augment_kwargs=dict(
            class_name="training.augment.AugmentPipe",
            p=0.12,
            xflip=1e8,
            yflip=1,
            scale=1,
            rotate_frac=1,
            aniso=1,
            translate_frac=1,
        ),
    ),
    # --arch=adm --precond=edm --fp16=1 --dropout=0.10, no augmentation (ImageNet-64's), tiny.
    # Attention is asked for at 4x4, where 32 channels make no head of 64: the reference builds
    # none (dhariwalunet.npz checks ADM's attention heads).
    "network-snapshot-tiny-adm": dict(
        network_kwargs=dict(
            class_name="training.networks.EDMPrecond",
            model_type="DhariwalUNet",
            model_channels=16,
            channel_mult=[1, 2],
            channel_mult_emb=2,
            num_blocks=1,
            attn_resolutions=[4],
            dropout=0.10,
            use_fp16=True,
        ),
        loss_kwargs=dict(class_name="training.loss.EDMLoss"),
        augment_kwargs=None,
    ),
}


def write_snapshot(spec: dict, path: str, dnnlib, misc, torch, gen) -> None:
    """training_loop.py's construction and snapshot code for ``spec``, pickled to ``path``."""
    from make_reference import randomise

    net = dnnlib.util.construct_class_by_name(**spec["network_kwargs"], **INTERFACE_KWARGS)
    net.train().requires_grad_(True)
    loss_fn = dnnlib.util.construct_class_by_name(**spec["loss_kwargs"])
    augment_kwargs = spec["augment_kwargs"]
    augment_pipe = (
        dnnlib.util.construct_class_by_name(**augment_kwargs) if augment_kwargs is not None else None
    )
    ema = copy.deepcopy(net).eval().requires_grad_(False)
    randomise(ema, torch, gen)  # stands in for training: the EMA is what a snapshot keeps

    data = dict(ema=ema, loss_fn=loss_fn, augment_pipe=augment_pipe, dataset_kwargs=dict(DATASET_KWARGS))
    for key, value in data.items():
        if isinstance(value, torch.nn.Module):
            value = copy.deepcopy(value).eval().requires_grad_(False)
            misc.check_ddp_consistency(value)
            data[key] = value.cpu()
        del value
    with open(path, "wb") as f:
        pickle.dump(data, f)


def write_tensor_layouts(out: str, torch, gen) -> None:
    """``tensor-layouts.pkl``: ``pickle.dump`` of a dict of tensors in the layouts and dtypes a
    network pickle may hold (views at an offset, transposed strides, a storage shared by two
    tensors, half / bfloat16 / int64 / bool, a 0-d tensor, a Parameter), and
    ``tensor-layouts.npz``: the same tensors as numpy arrays (bfloat16 as float32)."""
    base = torch.randn([6, 5], generator=gen)
    tensors = {
        "contiguous": torch.randn([3, 4], generator=gen),
        "offset_view": base[2:4, 1:4],  # offset 11, strides (5, 1)
        "transposed": base.t(),  # strides (1, 5)
        "shares_storage": base[1],  # the same storage as the two above
        "half": torch.randn([7], generator=gen).half(),
        "bfloat16": torch.randn([2, 3], generator=gen).bfloat16(),
        "int64": torch.arange(-3, 5, dtype=torch.int64).reshape(2, 4),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "parameter": torch.nn.Parameter(torch.randn([2, 2], generator=gen)),
    }
    with open(os.path.join(out, "tensor-layouts.pkl"), "wb") as f:
        pickle.dump(tensors, f)
    arrays = {k: (v.float() if v.dtype == torch.bfloat16 else v).detach().numpy() for k, v in tensors.items()}
    np.savez_compressed(os.path.join(out, "tensor-layouts.npz"), **arrays)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--edm", required=True, help="an NVlabs/edm checkout")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    sys.path.insert(0, args.edm)
    sys.path.insert(0, HERE)
    import dnnlib
    import torch
    from torch_utils import misc

    torch.set_num_threads(1)
    # check_ddp_consistency broadcasts every tensor from rank 0: a one-process group on CPU.
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.distributed.init_process_group(backend="gloo", rank=0, world_size=1)

    for index, (name, spec) in enumerate(SNAPSHOTS.items()):
        torch.manual_seed(index)
        gen = torch.Generator().manual_seed(2000 + index)
        path = os.path.join(args.out, f"{name}.pkl")
        write_snapshot(spec, path, dnnlib, misc, torch, gen)

        with open(path, "rb") as f:  # the reference's own loading (executes the embedded source)
            net = pickle.load(f)["ema"]
        batch, res, ch, label_dim = 4, net.img_resolution, net.img_channels, net.label_dim
        x = torch.randn([batch, ch, res, res], generator=gen)
        sigma = torch.tensor([0.002, 0.3, 2.5, 80.0])
        x = x * (sigma.reshape(-1, 1, 1, 1) ** 2 + 0.25).sqrt()  # noisy-data scale at each σ
        labels = torch.zeros([batch, label_dim])
        labels[torch.arange(3), torch.tensor([3, 0, 9])] = 1.0  # row 3 stays all zero
        with torch.no_grad():
            denoised = net(x, sigma, labels)
        np.savez_compressed(
            os.path.join(args.out, f"{name}.npz"),
            x=x.numpy(),
            sigma=sigma.numpy(),
            class_labels=labels.numpy(),
            denoised=denoised.numpy(),
            init_kwargs_json=np.asarray(json.dumps(dict(net.init_kwargs))),
            model_init_kwargs_json=np.asarray(json.dumps(dict(net.model.init_kwargs))),
            num_parameters=np.asarray(sum(p.numel() for p in net.parameters())),
        )
        size = os.path.getsize(path)
        print(
            f"{name}: {sum(p.numel() for p in net.parameters()):,} parameters, {size:,} bytes, "
            f"|denoised| max {denoised.abs().max():.3f}"
        )
    write_tensor_layouts(args.out, torch, torch.Generator().manual_seed(3000))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
