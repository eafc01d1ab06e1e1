"""The two Inception outputs ADM's evaluator reads besides the pool features, against
torch-fidelity's own extractor on the same random weights (``third_party/torch_fidelity/
make_adm_taps.py``): ``mixed_6/conv[..., :7]`` (Mixed_6d's 1×1 tower, NHWC-flattened: sFID)
and the bias-free logits ``pool @ fc.weight.T`` (torch-fidelity's ``"logits_unbiased"``:
Inception Score)."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.scoring import convert_inception, inception

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "third_party" / "torch_fidelity" / "adm_taps.npz"
U32 = 2.0**-24  # float32 unit roundoff
# test_inception's bound for features after 94 layers in another summation order (measured
# float32 vs float64 in the golden itself: <= 4e-6).
FEATURE_ATOL = 1e-4


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _classifier() -> np.ndarray:
    from helpers_fid import random_state_dict

    return random_state_dict()["fc.weight"]


def _dot_bound(pool: np.ndarray, w: np.ndarray) -> np.ndarray:
    """|float32 dot − exact| ≤ γ_n Σ|p_k w_k| (n = 2048 terms, γ_n ≈ n u), both sides: ×2."""
    return 2 * 2048 * U32 * (np.abs(pool) @ np.abs(w).T)


def test_logits_of_the_references_pool_are_its_logits(golden):
    w = _classifier()
    for case in ("cifar", "imagenet"):
        pool, want = golden[f"pool/{case}"], golden[f"logits/{case}"]
        assert np.std(want) > 0.1  # a classifier head that is not zero: the check can fail
        got = np.asarray(inception.logits(jnp.asarray(pool), jnp.asarray(w)))
        assert got.shape == (len(pool), inception.CLASSES)
        assert np.all(np.abs(got - want) <= _dot_bound(pool, w)), case


@pytest.mark.slow  # the Inception network at 299x299 on CPU, 3 images
def test_adm_features_match_torch_fidelitys_extractor(golden, tmp_path):
    from helpers_fid import random_state_dict

    weights = tmp_path / "w.npz"
    convert_inception.convert(random_state_dict(), str(weights), "0" * 64)
    params = convert_inception.load_weights(str(weights), pinned=False)
    w = convert_inception.load_classifier(str(weights), pinned=False)
    np.testing.assert_array_equal(w, _classifier())
    run = jax.jit(inception.adm_features, static_argnames=("value_range", "handling"))
    for case in ("cifar", "imagenet"):
        images = golden[f"input/{case}"].transpose(0, 2, 3, 1)
        pool, spatial = (np.asarray(a) for a in run(params, images))
        assert spatial.shape == (len(images), 17 * 17 * 7) and pool.shape == (len(images), 2048)
        want = golden[f"spatial/{case}"]
        assert np.std(want) > 0.02
        np.testing.assert_allclose(spatial, want, atol=FEATURE_ATOL, rtol=FEATURE_ATOL, err_msg=case)
        np.testing.assert_allclose(pool, golden[f"pool/{case}"], atol=FEATURE_ATOL, rtol=FEATURE_ATOL)
        # another block's 1x1 tower, or the channels in NCHW order, are told apart
        assert (
            np.abs(spatial.reshape(-1, 17, 17, 7).transpose(0, 3, 1, 2).reshape(len(images), -1) - want).max()
            > 1e-2
        )
        # logits through dew's pool: the dot's own bound plus the pool's error carried by |w|
        logits = np.asarray(inception.logits(jnp.asarray(pool), jnp.asarray(w)))
        bound = _dot_bound(pool, w) + FEATURE_ATOL * (1 + np.abs(pool)) @ np.abs(w).T
        assert np.all(np.abs(logits - golden[f"logits/{case}"]) <= bound), case


def test_weights_without_the_classifier_are_refused_saying_to_convert_again(tmp_path):
    from helpers_fid import random_state_dict

    from dew import pinned_weights

    arrays = {k: v for k, v in random_state_dict().items() if not k.startswith("fc.")}
    arrays = {k: v for k, v in arrays.items() if not k.endswith("num_batches_tracked")}
    old = tmp_path / "old.npz"
    pinned_weights.write_npz(str(old), arrays, "0" * 64)
    with pytest.raises(ValueError, match=r"hold no classifier fc.weight \[1008, 2048\].*convert .* again"):
        convert_inception.load_classifier(str(old), pinned=False)
    with pytest.raises(ValueError, match=r"not the standard pt_inception"):
        convert_inception.load_classifier(str(old))
