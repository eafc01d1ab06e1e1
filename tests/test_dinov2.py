"""dew's DINOv2 ViT and FD_DINOv2 preprocessing against facebookresearch/dinov2's and NVlabs/edm2's
own code, on stored goldens (third_party/dinov2; no PyTorch here), and the weights' pinning."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import registry
from dew.scoring import dinov2, dinov2_weights

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

HERE = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "dinov2"
U32 = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff, 2^-24
TINY = dinov2.ViTConfig(embed_dim=32, depth=2, num_heads=2, patch_size=14, mlp_ratio=4, train_grid=37)


@pytest.fixture(scope="module")
def reference():
    with np.load(HERE / "dinov2_reference.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def torch_arrays(reference):
    return {k[len("weights/") :]: v for k, v in reference.items() if k.startswith("weights/")}


@pytest.fixture(scope="module")
def params(torch_arrays):
    return dinov2.params_from_torch_names(torch_arrays, TINY)


def _vit_bound(config: ViTConfigT, tokens: int, scale: float) -> float:
    """γ_n·scale with n the summed length of every accumulation on the path to a feature: the
    patch convolution (3·p²), per block the qkv, proj, fc1 and fc2 dot products (d, d, d, 4d),
    the attention logits (d_head) and the softmax-weighted sum over the tokens (twice: the
    normaliser and the sum), the two LayerNorms' mean and variance (2·2·d), and the final
    LayerNorm (2·d). ``scale`` is the features' magnitude (LayerNorm outputs: O(1) × its scale)."""
    d, h = config.embed_dim, config.mlp_ratio * config.embed_dim
    per_block = d + d + d + h + d // config.num_heads + 2 * tokens + 4 * d
    n = 3 * config.patch_size**2 + config.depth * per_block + 2 * d
    return n * U32 / (1 - n * U32) * scale


ViTConfigT = dinov2.ViTConfig


def test_vit_matches_the_official_dinov2_in_float64(reference, params):
    """The official ``DinoVisionTransformer`` (random weights, embed 32, depth 2, 37×37 learned grid)
    on 28×28 inputs (a 2×2 grid: the position embeddings go through ``interpolate_pos_encoding``'s
    bicubic with the 0.1 offset) in float64; dew in float32 lies within float32's worst-case
    accumulation bound. A wrong offset, GELU, LayerNorm ε, head split or qkv order moves features
    by > 1e-2."""
    x = reference["vit28/x"].transpose(0, 2, 3, 1)
    got = np.asarray(jax.jit(dinov2.network(TINY).apply)(params, x))
    want = reference["vit28/features64"]
    assert got.shape == want.shape == (2, 32)
    assert np.std(want) > 0.3  # not degenerate
    bound = _vit_bound(TINY, tokens=1 + 2 * 2, scale=float(np.abs(want).max()))
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)
    # the stored float32 run of the reference itself sits inside the same bound
    assert np.abs(reference["vit28/features32"] - want).max() <= bound


def _preprocess_bounds(in_h: int, in_w: int) -> tuple[float, float]:
    """(dew's float32 bound, PyTorch float32's extra) on one normalised preprocessed value.

    dew: two matrix products with taps_h + taps_w terms of |w|·255, then /255, −mean, /std:
    γ_{taps_h+taps_w+3} · Σ|w_h|·Σ|w_w| · 255 / (255 · min std).
    PyTorch's float32 kernel also rounds each sample centre (s·(i + 0.5), s = in/out) to float32:
    an error ≤ 2·in·u in the position, which moves each PIL-bicubic weight by ≤ max|f′|·δ
    (max|f′| = 25/18 for a = −0.5, at x = 5/9) and the renormalised weights by up to twice that,
    over ``taps`` weights per axis on values ≤ 255."""
    bound_dew, bound_torch, norm = 0.0, 0.0, 1.0
    taps = 0
    for size in (in_h, in_w):
        m = dinov2.antialiased_bicubic_matrix(size, dinov2.RESOLUTION)
        t = int((m != 0).sum(axis=1).max())
        taps += t
        norm *= float(np.abs(m).sum(axis=1).max())
        bound_torch += 2 * t * (25 / 18) * (2 * size * U32) * 255
    bound_dew = (taps + 3) * U32 / (1 - (taps + 3) * U32) * norm * 255
    std = min(dinov2.IMAGENET_STD)
    return bound_dew / (255 * std), bound_torch * norm / (255 * std)


@pytest.mark.parametrize("case", ["up", "down"])
def test_preprocessing_matches_edm2(reference, case):
    """edm2's ``DINOv2Detector`` preprocessing (its own ``__call__``, model = identity) on uint8
    images upsampled (24×24) and downsampled (250×230) to 224: dew equals the float64 evaluation of
    the same ``F.interpolate(bicubic, antialias=True)`` within its float32 bound, and edm2's
    float32 output within that plus PyTorch's position rounding. The non-antialiased bicubic
    (A = −0.75), bilinear, align_corners or a missing mean/std are all off by > 1e-2."""
    images = reference[f"{case}/images"].transpose(0, 2, 3, 1)
    got = np.asarray(jax.jit(dinov2.preprocess)(images)).transpose(0, 3, 1, 2).reshape(-1)
    got = got[reference[f"{case}/preprocessed_index"]]
    dew_bound, torch_bound = _preprocess_bounds(*images.shape[1:3])
    assert np.abs(got - reference[f"{case}/preprocessed64"]).max() <= dew_bound
    assert np.abs(got - reference[f"{case}/preprocessed"]).max() <= dew_bound + torch_bound
    assert np.std(reference[f"{case}/preprocessed"]) > 0.5


@pytest.mark.parametrize("case", ["up", "down"])
def test_fd_dinov2_features_match_edm2_with_the_official_vit(reference, params, case):
    """The whole detector: edm2's preprocessing then the official ViT (float64) against
    ``dinov2.features`` (a 16×16 grid, so the 37×37 embeddings are resampled with scale 16.1/37)."""
    images = reference[f"{case}/images"].transpose(0, 2, 3, 1)
    run = jax.jit(dinov2.features, static_argnames=("value_range", "config"))
    got = np.asarray(run(params, images, config=TINY))
    want = reference[f"{case}/features64"]
    assert got.shape == want.shape
    dew_pre, torch_pre = _preprocess_bounds(*images.shape[1:3])
    bound = _vit_bound(TINY, tokens=1 + 16 * 16, scale=float(np.abs(want).max())) + dew_pre + torch_pre
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)


def test_value_range_maps_to_the_uint8_scale(params):
    """Images in [−1, 1] are the uint8 values mapped linearly: x = v/127.5 − 1 scores as v."""
    v = np.random.default_rng(0).integers(0, 256, (1, 20, 20, 3)).astype(np.uint8)
    a = np.asarray(dinov2.preprocess(jnp.asarray(v)))
    b = np.asarray(dinov2.preprocess(jnp.asarray(v.astype(np.float32) / 127.5 - 1), value_range=(-1.0, 1.0)))
    np.testing.assert_allclose(a, b, atol=64 * U32 * 255 / (255 * 0.224))


def test_position_embedding_matrix_is_the_identity_on_the_learned_grid():
    """The resampling keeps a 37×37 grid as is only through the ``npatch == N`` branch; the bicubic
    matrix for g = 37 (scale 37.1/37) is not the identity, which is why that branch exists."""
    m = dinov2.bicubic_matrix(37, 37, 37.1 / 37)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-6)
    assert np.abs(m - np.eye(37)).max() > 1e-3


def test_conversion_checks_digest_and_refuses_unpinned(tmp_path, torch_arrays):
    """The converter writes the source digest and a content digest; the loader refuses an
    unpinned source unless allowed, refuses altered arrays, and a missing file is one line
    naming the file, the digest situation and how to get it."""
    out = tmp_path / "w.npz"
    dinov2_weights.convert(dict(torch_arrays, mask_token=np.zeros((1, 32))), str(out), "ab" * 32, config=TINY)
    with pytest.raises(ValueError, match="not pinned"):
        dinov2_weights.load_weights(str(out), config=TINY)
    loaded = dinov2_weights.load_weights(str(out), allow_unpinned=True, config=TINY)
    np.testing.assert_array_equal(loaded["dinov2"]["cls_token"], torch_arrays["cls_token"])
    with np.load(out) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["norm.bias"] = arrays["norm.bias"] + 1
    np.savez(out, **arrays)
    with pytest.raises(ValueError, match="damaged"):
        dinov2_weights.load_weights(str(out), allow_unpinned=True, config=TINY)
    missing = tmp_path / "absent.npz"
    with pytest.raises(FileNotFoundError) as e:
        dinov2_weights.load_weights(str(missing))
    message = str(e.value)
    assert "\n" not in message and str(missing) in message and dinov2_weights.SOURCE_NAME in message
    assert "no SHA-256 is published" in message and "python -m dew.scoring.dinov2_weights" in message


def test_converter_cli_refuses_an_unpinned_file(tmp_path, capsys):
    source = tmp_path / dinov2_weights.SOURCE_NAME
    source.write_bytes(b"not the weights")
    assert dinov2_weights.main([f"--input={source}", f"--output={tmp_path / 'o.npz'}"]) == 2
    assert "not pinned" in capsys.readouterr().err
    assert not (tmp_path / "o.npz").exists()


def test_wrong_shapes_are_named(torch_arrays):
    bad = dict(torch_arrays)
    bad["blocks.1.mlp.fc1.weight"] = bad["blocks.1.mlp.fc1.weight"][:, :5]
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.fc1\.weight"):
        dinov2.params_from_torch_names(bad, TINY)
    with pytest.raises(KeyError, match="pos_embed"):
        dinov2.params_from_torch_names({k: v for k, v in torch_arrays.items() if k != "pos_embed"}, TINY)


def test_fd_dinov2_is_a_registered_metric_that_says_what_it_needs(monkeypatch):
    from dew.scoring import dinov2_metrics

    assert registry.metrics["fd_dinov2"] is dinov2_metrics.fd_dinov2
    monkeypatch.delenv(dinov2_metrics.REFERENCE_ENV, raising=False)
    dinov2_metrics._reference.cache_clear()
    with pytest.raises(FileNotFoundError, match=dinov2_metrics.REFERENCE_ENV):
        dinov2_metrics.fd_dinov2.check_ready()


def test_scorer_statistics_stream_features(params):
    """``DINOv2Scorer`` streams batches into the same mean/covariance one array gives."""
    from dew.scoring.dinov2_metrics import DINOv2Scorer
    from dew.scoring.statistics import feature_statistics

    scorer = DINOv2Scorer(params=params, config=TINY)
    images = np.random.default_rng(1).uniform(-1, 1, (6, 16, 16, 3)).astype(np.float32)
    stats = scorer.statistics([images[:4], images[4:]])
    mu, sigma = feature_statistics(np.asarray(scorer.features(images), np.float64))
    np.testing.assert_allclose(stats.mu, mu, atol=1e-6)
    np.testing.assert_allclose(stats.sigma, sigma, atol=1e-6)
