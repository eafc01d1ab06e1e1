"""dew's ``"tf1"`` FID image handling (the 2015-12-05 TF graph's, as NVlabs/edm's detector and
torch-fidelity reproduce it) against torch-fidelity's own code: goldens from
``third_party/torch_fidelity/make_reference.py`` (no PyTorch here)."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.scoring import inception
from dew.scoring.fid_detector import check_reference, inception_detector, recorded_handling
from dew.scoring.fid_reference import FidInputError

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

GOLDEN = (
    pathlib.Path(__file__).resolve().parent.parent / "third_party" / "torch_fidelity" / "tf1_reference.npz"
)
# A float32 lerp a + (b − a)·t of values ≤ 255 rounds three times (the difference, the product,
# the sum; ½ ulp each, ulp(255) = 2⁻¹⁶), and the second lerp carries the first one's error at
# most once more (|1 − t| + |t| = 1): ≤ 1.5 + 1.5 + 1.5 ulp; 4 ulp covers it, and a fused
# multiply-add (fewer roundings) stays inside.
RESIZE_ATOL = 4 * 2.0**-16


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("case", ["cifar", "up", "down", "mixed"])
def test_tf1_resize_matches_torch_fidelity(golden, case):
    """Up (32 -> 299, 12x10 -> 29x31), down (41x37 -> 13x11) and mixed; measured bit-exact on
    this CPU. pytorch-fid's half-pixel resize is off by > 100 (of 255) on the same inputs."""
    x = jnp.asarray(golden[f"resize_input/{case}"].transpose(0, 2, 3, 1).astype(np.float32))
    height, width = (int(v) for v in golden[f"resize_size/{case}"])
    size = (height, width)
    want = golden[f"resize/{case}"]
    got = np.asarray(inception.resize_bilinear_tf1(x, size)).transpose(0, 3, 1, 2)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=RESIZE_ATOL)
    half_pixel = np.asarray(inception.resize_bilinear(x, size)).transpose(0, 3, 1, 2)
    assert np.abs(half_pixel - want).max() > 10.0  # the other resize is told apart


def test_tf1_resize_formula_by_hand():
    """2 -> 4 without half-pixel centres: sources 0, 0.5, 1, 1.5 (upper neighbour clamped to the
    last pixel) -> [a, (a + b)/2, b, b]; 4 -> 2: sources 0 and 2 -> [v0, v2]."""
    a, b = 1.0, 3.0
    up = np.array([a, b], np.float32).reshape(1, 2, 1, 1) * np.ones((1, 1, 2, 1), np.float32)
    got = np.asarray(inception.resize_bilinear_tf1(jnp.asarray(up), (4, 2)))[0, :, 0, 0]
    np.testing.assert_array_equal(got, [a, (a + b) / 2, b, b])
    down = np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)
    np.testing.assert_array_equal(
        np.asarray(inception.resize_bilinear_tf1(jnp.asarray(down), (2, 1)))[0, :, 0, 0], [0, 2]
    )


def test_tf1_scaling_is_the_graphs():
    """(x − 128) / 128 on pixel values: 0 -> −1, 128 -> 0, 255 -> 127/128 (pytorch-fid's
    x / 255 · 2 − 1 gives 1); [−1, 1] images reach the same pixel values first."""
    pixels = jnp.asarray(np.array([0, 128, 255], np.float32).reshape(1, 1, 3, 1))
    got = np.asarray(inception.preprocess(pixels, (0.0, 255.0), resize=False, handling="tf1"))[0, 0, :, 0]
    np.testing.assert_array_equal(got, [-1.0, 0.0, 127 / 128])
    other = np.asarray(inception.preprocess(pixels, (0.0, 255.0), resize=False))[0, 0, :, 0]
    assert other[2] == 1.0
    signed = pixels / 127.5 - 1.0
    again = np.asarray(inception.preprocess(signed, (-1.0, 1.0), resize=False, handling="tf1"))[0, 0, :, 0]
    np.testing.assert_allclose(again, got, atol=2**-20)
    with pytest.raises(ValueError, match=r"handling='tf2' is not an image handling; expected one of"):
        inception.preprocess(pixels, handling="tf2")


@pytest.mark.slow  # the Inception network at 299x299 on CPU, 3 images, twice
def test_tf1_features_match_torch_fidelitys_extractor(golden):
    """torch-fidelity's FeatureExtractorInceptionV3 (its resize, scaling and network) on uint8
    images, with the pytorch-fid parity weights: dew's features with ``handling="tf1"`` agree to
    1e-4 (test_inception's bound and argument: float32 summation order over 94 layers; float32
    vs float64 in the golden itself: ≤ 1.7e-6). pytorch-fid's handling on the same images moves
    the features by far more, so the comparison tells the handlings apart."""
    from helpers_fid import random_state_dict

    params = inception.params_from_torch_names(random_state_dict())
    run = jax.jit(inception.features, static_argnames=("value_range", "resize", "handling"))
    for case in ("cifar", "nonsquare"):
        images = golden[f"features_input/{case}"].transpose(0, 2, 3, 1).astype(np.float32)
        want = golden[f"features/{case}"]
        assert np.std(want) > 0.05 and np.abs(want - golden[f"features64/{case}"]).max() < 1e-5
        got = np.asarray(run(params, images, value_range=(0.0, 255.0), handling="tf1"))
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=case)
        if case == "cifar":
            other = np.asarray(run(params, images, value_range=(0.0, 255.0), handling="pytorch_fid"))
            assert np.abs(other - want).max() > 1e-2


def test_a_reference_of_the_other_handling_is_refused(tmp_path):
    ref = {"mu": np.zeros(4), "sigma": np.eye(4), "resolution": (8, 8)}
    described = "dew inception_fid 2015-12-05, image handling pytorch_fid, weights sha256 " + "0" * 64
    with pytest.raises(
        FidInputError, match=r"computed with image handling 'pytorch_fid', the samples .* 'tf1'"
    ):
        check_reference({**ref, "detector": described}, "r.npz", (8, 8), None, "tf1")
    check_reference({**ref, "detector": described}, "r.npz", (8, 8), None, "pytorch_fid")
    # dew's files from before the handling was recorded were pytorch-fid's; others record none
    assert recorded_handling("dew inception_fid 2015-12-05, weights sha256 " + "0" * 64) == "pytorch_fid"
    assert recorded_handling(None) is None and recorded_handling("projection (test)") is None
    check_reference(ref, "r.npz", (8, 8), None, "tf1")  # NVlabs's files: accepted
    with pytest.raises(ValueError, match=r"--image_handling='bilinear' is not an image handling"):
        inception_detector(str(tmp_path / "none.npz"), handling="bilinear")
