"""dew's FID Inception against pytorch-fid's, on stored reference features (no PyTorch here)."""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.scoring import inception

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

HERE = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "pytorch_fid"


def _weights_module():
    spec = importlib.util.spec_from_file_location("pytorch_fid_weights", HERE / "weights.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference():
    with np.load(HERE / "inception_reference.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def torch_named_arrays(reference):
    """The reference weights under PyTorch names: generated convolutions + stored batch norms."""
    gen = _weights_module()
    arrays = {k[len("bn/") :]: v for k, v in reference.items() if k.startswith("bn/")}
    for path, leaves in inception._expected_shapes().items():
        name = path[len("inception_fid/") :].replace("/", ".") + ".conv.weight"
        h, w, i, o = leaves["w"]
        arrays[name] = gen.conv_weight(name, (o, i, h, w))
    return arrays


@pytest.mark.slow
def test_features_match_pytorch_fid(reference, torch_named_arrays):
    """Same architecture, same weights, same inputs: float32 convolutions accumulate in a
    different order in XLA and PyTorch, ~1e-7 relative per layer over 94 layers, so 1e-4 (the
    issue's bound) on features of O(0.1-1) leaves a wide margin yet fails on any structural
    difference (a wrong pool, padding, branch order or resize moves features by >1e-2)."""
    params = inception.params_from_torch_names(torch_named_arrays)
    run = jax.jit(inception.features, static_argnames=("value_range", "resize"))
    for key, resize in (("small", True), ("large", True), ("native", False)):
        images = reference[f"input/{key}"].transpose(0, 2, 3, 1).astype(np.float32) / 255.0
        got = np.asarray(run(params, images, value_range=(0.0, 1.0), resize=resize))
        want = reference[f"features/{key}"]
        assert got.shape == want.shape == (len(images), inception.FEATURE_DIM)
        assert np.std(want) > 0.05 and np.mean(want > 0) > 0.3  # the reference is not degenerate
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=key)


def test_resize_matches_the_half_pixel_bilinear_formula():
    """Upsampling 2 -> 4 with half-pixel centres: outputs sit at source coordinates
    −0.25 (clamped to 0), 0.25, 0.75, 1.25 (neighbour clamped) -> [a, 0.75a+0.25b, 0.25a+0.75b, b]."""
    a, b = 1.0, 3.0
    x = np.array([a, b], np.float32).reshape(1, 2, 1, 1) * np.ones((1, 1, 2, 1), np.float32)
    got = np.asarray(inception.resize_bilinear(jnp.asarray(x), (4, 2)))[0, :, 0, 0]
    np.testing.assert_allclose(got, [a, 0.75 * a + 0.25 * b, 0.25 * a + 0.75 * b, b], rtol=1e-6)


def test_weight_names_and_shapes_are_checked(torch_named_arrays):
    arrays = dict(torch_named_arrays)
    del arrays["Mixed_7c.branch_pool.conv.weight"]
    with pytest.raises(ValueError, match="Mixed_7c/branch_pool/w has shape None"):
        inception.params_from_torch_names(arrays)
    arrays = dict(torch_named_arrays)
    arrays["Conv2d_1a_3x3.bn.running_var"] = np.ones(5, np.float32)
    with pytest.raises(ValueError, match=r"Conv2d_1a_3x3/var has shape \(5,\)"):
        inception.params_from_torch_names(arrays)
