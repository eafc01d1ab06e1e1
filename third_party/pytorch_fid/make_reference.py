"""Write ``inception_reference.npz``: pytorch-fid's FID Inception features on fixed inputs with
deterministic random weights (no pretrained weights are downloaded or used).

Needs pytorch-fid 0.3.0 + torchvision (matching torch) in a PyTorch environment:

    /work/venv-torch/bin/pip install --no-deps "torchvision==0.28.*" pytorch-fid==0.3.0
    /work/venv-torch/bin/python third_party/pytorch_fid/make_reference.py \
        --out=third_party/pytorch_fid/inception_reference.npz

(torchvision's compiled-ops registration is stubbed: see below.) pytorch-fid's
``InceptionV3(output_blocks=[3])`` is built with its weight download and load
disabled (``load_state_dict_from_url`` and ``Module.load_state_dict`` patched to no-ops while it
is constructed), then: every convolution gets ``weights.conv_weight(name)`` (He-scaled), every batch norm γ, β
and running statistics near the identity drawn from a seeded NumPy generator, and the model is
evaluated in eval mode. Stored: the batch-norm tensors (``bn/<torchvision name>``, the names of
the official weights file),
the uint8 inputs, and the 2048-d features (float32, and the same module in float64 for scale),
with the module's resize (299×299) and without (``resize_input`` switched off).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import types
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import weights

# torchvision 0.28.0's wheel here is a CUDA build whose compiled ops do not load on this CPU-only
# torch; pytorch-fid needs only torchvision's pure-Python Inception modules, so the two modules
# that register the compiled ops are stubbed before torchvision is imported.
for _name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_name, types.ModuleType(_name))

# pytorch-fid's block list -> torchvision's module names (those of pt_inception-*.pth).
BLOCK_NAMES = {
    "blocks.0.0": "Conv2d_1a_3x3",
    "blocks.0.1": "Conv2d_2a_3x3",
    "blocks.0.2": "Conv2d_2b_3x3",
    "blocks.1.0": "Conv2d_3b_1x1",
    "blocks.1.1": "Conv2d_4a_3x3",
    **{
        f"blocks.2.{i}": n
        for i, n in enumerate(
            ["Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e"]
        )
    },
    **{f"blocks.3.{i}": n for i, n in enumerate(["Mixed_7a", "Mixed_7b", "Mixed_7c"])},
}


def torchvision_name(key: str) -> str:
    parts = key.split(".")
    return ".".join([BLOCK_NAMES[".".join(parts[:3])], *parts[3:]])


def build(resize: bool):
    import pytorch_fid.inception as pfi

    with (
        mock.patch.object(pfi, "load_state_dict_from_url", lambda *a, **k: None),
        mock.patch.object(torch.nn.Module, "load_state_dict", lambda self, *a, **k: None),
    ):
        return pfi.InceptionV3([3], resize_input=resize, normalize_input=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    inputs = {
        "small": rng.integers(0, 256, (2, 3, 96, 90), dtype=np.uint8),  # upsampled to 299
        "large": rng.integers(0, 256, (1, 3, 311, 307), dtype=np.uint8),  # downsampled to 299
        "native": rng.integers(0, 256, (2, 3, 80, 76), dtype=np.uint8),  # no resize
    }
    model = build(resize=True)
    state = model.state_dict()
    new = {}
    for key, value in state.items():
        name = torchvision_name(key)
        if key.endswith("conv.weight"):
            new[key] = torch.from_numpy(weights.conv_weight(name, tuple(value.shape)))
        elif key.endswith("bn.weight"):
            new[key] = torch.from_numpy(rng.uniform(0.8, 1.2, value.shape).astype(np.float32))
        elif key.endswith("bn.bias"):
            new[key] = torch.from_numpy(rng.uniform(-0.1, 0.1, value.shape).astype(np.float32))
        elif key.endswith("bn.running_mean"):
            new[key] = torch.from_numpy(rng.uniform(-0.05, 0.05, value.shape).astype(np.float32))
        elif key.endswith("bn.running_var"):
            new[key] = torch.from_numpy(rng.uniform(0.8, 1.2, value.shape).astype(np.float32))
        else:
            new[key] = value
    torch.nn.Module.load_state_dict(model, new)
    # Batch norms near the identity and He-scaled kernels keep every layer at O(1) without
    # fitting statistics to the inputs (subtracting a data-fitted mean from a large common
    # offset would amplify float32 round-off, in PyTorch and JAX alike).
    model.eval()
    out = {f"input/{k}": v for k, v in inputs.items()}
    for k in ("small", "large", "native"):
        model.resize_input = k != "native"
        x = torch.from_numpy(inputs[k].astype(np.float32) / 255.0)
        with torch.no_grad():
            out[f"features/{k}"] = model(x)[0][:, :, 0, 0].numpy()
            out[f"features64/{k}"] = model.double()(x.double())[0][:, :, 0, 0].numpy()
        model.float()
    model.resize_input = True
    for key, value in model.state_dict().items():
        if ".bn." in key and not key.endswith("num_batches_tracked"):
            out[f"bn/{torchvision_name(key)}"] = value.numpy().astype(np.float32)
    np.savez_compressed(args.out, **out)
    print(f"wrote {len(out)} arrays to {args.out}; feature scale {np.abs(out['features/small']).mean():.3f}")


if __name__ == "__main__":
    main()
