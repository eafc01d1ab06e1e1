"""Inception weights for tests: the pytorch_fid parity test's deterministic weights under PyTorch
names (third_party/pytorch_fid), converted as ``python -m dew.convert_inception`` would."""

from __future__ import annotations

import importlib.util

import numpy as np
from helpers_common import ROOT

from dew.scoring import inception

HERE = ROOT / "third_party" / "pytorch_fid"


def random_state_dict() -> dict[str, np.ndarray]:
    """The parity test's deterministic weights under PyTorch names, plus what the official file
    also holds and the converter drops (the classifier's bias, batch counters)."""
    spec = importlib.util.spec_from_file_location("pytorch_fid_weights", HERE / "weights.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with np.load(HERE / "inception_reference.npz") as ref:
        arrays = {k[len("bn/") :]: ref[k] for k in ref.files if k.startswith("bn/")}
    for path, leaves in inception._expected_shapes().items():
        name = path[len("inception_fid/") :].replace("/", ".")
        h, w, i, o = leaves["w"]
        arrays[name + ".conv.weight"] = gen.conv_weight(name + ".conv.weight", (o, i, h, w))
        arrays[name + ".bn.num_batches_tracked"] = np.array(0)
    arrays["fc.weight"] = gen.conv_weight("fc.weight", (1008, 2048))  # third_party/torch_fidelity's
    arrays["fc.bias"] = np.zeros(1008, np.float32)
    return arrays
