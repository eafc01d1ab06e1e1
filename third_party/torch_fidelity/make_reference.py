"""Write ``tf1_reference.npz``: torch-fidelity's own TensorFlow-1.x-exact image handling, for
dew's ``"tf1"`` FID image handling (``dew.scoring.inception``; ``tests/test_inception_tf1.py``).

Needs torch-fidelity 0.4.0 in a PyTorch environment (its package ``__init__`` imports
torchvision, which is not needed here: the script imports the two modules it uses straight
from the installed package directory, under a stand-in parent package):

    /work/venv-torch/bin/pip install --no-deps torch-fidelity==0.4.0
    /work/venv-torch/bin/python third_party/torch_fidelity/make_reference.py \
        --out=third_party/torch_fidelity/tf1_reference.npz

Two parts, both computed by torch-fidelity's code, nothing of it copied:

* ``resize/<case>``: ``interpolate_compat_tensorflow.interpolate_bilinear_2d_like_tensorflow1x(
  x, size, align_corners=False)`` (its default ``method="slow"``, which its docstring calls
  bit-exact with TensorFlow 1.x on CPU) on float32 images of uint8 values,
  ``resize_input/<case>`` (uint8 NCHW) to ``resize_size/<case>``: ``cifar`` 1×1×32×32 -> 299×299
  (the CIFAR-10 case), ``up`` 2×3×12×10 -> 29×31, ``down`` 1×2×41×37 -> 13×11, ``mixed``
  1×1×9×40 -> 20×17 (rows up, columns down).
* ``features/<case>``: ``feature_extractor_inceptionv3.FeatureExtractorInceptionV3``'s own
  ``forward`` (uint8 NCHW in; its ``x.to(float32)``, the resize above to 299×299,
  ``(x - 128) / 128``, the FID Inception, the 2048-d pool) with feature ``"2048"``, on
  ``features_input/<case>`` uint8: ``cifar`` 2×3×32×32 and ``nonsquare`` 1×3×12×10. Its weights
  are the pytorch-fid parity test's random ones (``third_party/pytorch_fid``: convolutions from
  ``weights.py``, batch norms from ``inception_reference.npz``; the classifier head zeros),
  saved to a temporary ``.pth`` that the extractor's ``feature_extractor_weights_path`` loads;
  no pretrained weights are downloaded or used. ``features64/<case>``: the same extractor run
  in float64 (``.double()`` and its ``feature_extractor_internal_dtype`` set to float64; its
  forward returns them rounded to float32): the scale of float32's own error.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys
import tempfile
import types
from unittest import mock

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
PYTORCH_FID = HERE.parent / "pytorch_fid"


def torch_fidelity_module(name: str):
    """``torch_fidelity.<name>`` loaded from the installed package without its ``__init__``."""
    if "torch_fidelity" not in sys.modules:
        folder = os.path.dirname(importlib.util.find_spec("torch_fidelity").origin)
        package = types.ModuleType("torch_fidelity")
        package.__path__ = [folder]
        sys.modules["torch_fidelity"] = package
    return importlib.import_module(f"torch_fidelity.{name}")


def parity_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    spec = importlib.util.spec_from_file_location("pytorch_fid_weights", PYTORCH_FID / "weights.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with np.load(PYTORCH_FID / "inception_reference.npz", allow_pickle=False) as ref:
        bn = {k[len("bn/") :]: ref[k] for k in ref.files if k.startswith("bn/")}
    state = {}
    for key, value in model.state_dict().items():
        if key.endswith("conv.weight"):
            state[key] = torch.from_numpy(gen.conv_weight(key, tuple(value.shape)))
        elif key in bn:
            state[key] = torch.from_numpy(bn[key])
        elif key.startswith("fc.") or key.endswith("num_batches_tracked"):
            state[key] = torch.zeros_like(value)
        else:
            raise KeyError(f"no parity weight for {key}")
    return state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    interp = torch_fidelity_module("interpolate_compat_tensorflow")
    fe = torch_fidelity_module("feature_extractor_inceptionv3")
    rng = np.random.default_rng(31)
    out: dict[str, np.ndarray] = {}
    resize_cases = {
        "cifar": ((1, 1, 32, 32), (299, 299)),
        "up": ((2, 3, 12, 10), (29, 31)),
        "down": ((1, 2, 41, 37), (13, 11)),
        "mixed": ((1, 1, 9, 40), (20, 17)),
    }
    for case, (shape, size) in resize_cases.items():
        images = rng.integers(0, 256, shape, dtype=np.uint8)
        x = torch.from_numpy(images.astype(np.float32))
        y = interp.interpolate_bilinear_2d_like_tensorflow1x(x, size=size, align_corners=False)
        assert y.dtype == torch.float32 and tuple(y.shape) == (*shape[:2], *size)
        out[f"resize_input/{case}"], out[f"resize_size/{case}"] = images, np.asarray(size, np.int64)
        out[f"resize/{case}"] = y.numpy()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "parity-weights.pth")
        # The extractor loads its weights in __init__; a first one, built with loading disabled
        # (as the pytorch-fid script does), only names the tensors and their shapes.
        with (
            mock.patch.object(torch, "load", lambda *a, **k: {}),
            mock.patch.object(torch.nn.Module, "load_state_dict", lambda self, *a, **k: None),
        ):
            shapes = fe.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], path)
        torch.save(parity_weights(shapes), path)
        model = fe.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], path)
        # torch-fidelity 0.4.0's text_to_dtype maps "float64" to float32, so its
        # feature_extractor_internal_dtype option cannot give float64: the same module is
        # converted (.double()) and told its dtype, for the float64 features.
        model64 = fe.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], path).double()
        model64.feature_extractor_internal_dtype = torch.float64
        models = {"float32": model, "float64": model64}
    feature_cases = {"cifar": (2, 3, 32, 32), "nonsquare": (1, 3, 12, 10)}
    for case, shape in feature_cases.items():
        images = rng.integers(0, 256, shape, dtype=np.uint8)
        with torch.no_grad():
            (f32,) = models["float32"](torch.from_numpy(images))
            (f64,) = models["float64"](torch.from_numpy(images))
        assert f32.dtype == torch.float32 and tuple(f32.shape) == (shape[0], 2048)
        out[f"features_input/{case}"] = images
        out[f"features/{case}"], out[f"features64/{case}"] = f32.numpy(), f64.numpy()
        print(
            case,
            "feature scale",
            float(f32.abs().mean()),
            "float32 vs 64",
            float((f32 - f64.float()).abs().max()),
        )
    np.savez_compressed(args.out, **out)
    print(f"wrote {len(out)} arrays to {args.out}")


if __name__ == "__main__":
    main()
