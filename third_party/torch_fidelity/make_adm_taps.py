"""Write ``adm_taps.npz``: the two Inception outputs ADM's evaluator reads besides the pool
features, from torch-fidelity's own extractor, for ``tests/test_inception_adm.py``.

openai/guided-diffusion's ``evaluations/evaluator.py`` takes ``mixed_6/conv:0`` of the
2015-12-05 graph (its first 7 channels: sFID) and the logits ``pool_3 @ softmax/weights``
without the bias (``softmax/logits/MatMul``'s weight input: Inception Score). In the PyTorch
names of that graph (pytorch-fid's and torch-fidelity's conversion), ``mixed_6/conv`` is
``Mixed_6d.branch1x1`` (its ReLU output) and ``softmax/weights`` is ``fc.weight`` transposed;
torch-fidelity's own ``"logits_unbiased"`` feature is exactly ``pool @ fc.weight.T``.

Same set-up as ``make_reference.py`` (torch-fidelity 0.4.0, loaded without its ``__init__``;
the pytorch-fid parity test's random weights), with a classifier head that is not zero:
``fc.weight`` from ``third_party/pytorch_fid/weights.py``'s formula under the name
``"fc.weight"`` (shape [1008, 2048]), ``fc.bias`` zeros. Outputs, for uint8 NCHW
``input/<case>`` (``cifar`` 2×3×32×32, ``imagenet`` 1×3×64×64):

* ``pool/<case>``: the extractor's ``"2048"`` feature;
* ``logits/<case>``: its ``"logits_unbiased"`` feature [N, 1008];
* ``spatial/<case>``: ``Mixed_6d.branch1x1``'s output (a forward hook), first 7 channels, as
  NHWC flattened [N, 17·17·7] (ADM's ``spatial[..., :7]`` then ``reshape([N, -1])``);
* ``*64/<case>``: the same in float64 (the module converted with ``.double()``).

    /work/venvs/tfid/bin/python third_party/torch_fidelity/make_adm_taps.py \
        --out=third_party/torch_fidelity/adm_taps.npz
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys
import tempfile
from unittest import mock

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_reference import parity_weights, torch_fidelity_module  # noqa: E402

FEATURES = ["2048", "logits_unbiased"]


def fc_weight() -> np.ndarray:
    spec = importlib.util.spec_from_file_location("w", HERE.parent / "pytorch_fid" / "weights.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen.conv_weight("fc.weight", (1008, 2048))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    fe = torch_fidelity_module("feature_extractor_inceptionv3")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "parity-weights.pth")
        with (
            mock.patch.object(torch, "load", lambda *a, **k: {}),
            mock.patch.object(torch.nn.Module, "load_state_dict", lambda self, *a, **k: None),
        ):
            shapes = fe.FeatureExtractorInceptionV3("inception-v3-compat", FEATURES, path)
        state = parity_weights(shapes)
        state["fc.weight"] = torch.from_numpy(fc_weight())
        torch.save(state, path)
        model = fe.FeatureExtractorInceptionV3("inception-v3-compat", FEATURES, path)
        model64 = fe.FeatureExtractorInceptionV3("inception-v3-compat", FEATURES, path).double()
        model64.feature_extractor_internal_dtype = torch.float64
    taps: dict[str, torch.Tensor] = {}
    for name, m in (("32", model), ("64", model64)):
        m.Mixed_6d.branch1x1.register_forward_hook(lambda mod, i, o, name=name: taps.__setitem__(name, o))
    rng = np.random.default_rng(46)
    out: dict[str, np.ndarray] = {}
    for case, shape in {"cifar": (2, 3, 32, 32), "imagenet": (1, 3, 64, 64)}.items():
        images = rng.integers(0, 256, shape, dtype=np.uint8)
        out[f"input/{case}"] = images
        for suffix, m, tap in (("", model, "32"), ("64", model64, "64")):
            with torch.no_grad():
                pool, logits = m(torch.from_numpy(images))
            spatial = taps[tap][:, :7].permute(0, 2, 3, 1).reshape(shape[0], -1)
            out[f"pool{suffix}/{case}"] = pool.numpy()
            out[f"logits{suffix}/{case}"] = logits.numpy()
            out[f"spatial{suffix}/{case}"] = spatial.to(torch.float32).numpy()
        print(
            case,
            "pool vs 64",
            float(np.abs(out[f"pool/{case}"] - out[f"pool64/{case}"]).max()),
            "logits vs 64",
            float(np.abs(out[f"logits/{case}"] - out[f"logits64/{case}"]).max()),
            "spatial vs 64",
            float(np.abs(out[f"spatial/{case}"] - out[f"spatial64/{case}"]).max()),
            "spatial scale",
            float(np.abs(out[f"spatial/{case}"]).mean()),
            "logits scale",
            float(np.abs(out[f"logits/{case}"]).mean()),
        )
    np.savez_compressed(args.out, **out)
    print(f"wrote {len(out)} arrays to {args.out}")


if __name__ == "__main__":
    main()
