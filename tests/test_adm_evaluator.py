"""dew's ADM evaluation suite (``dew.scoring.adm_evaluator``) against openai/guided-diffusion's own
``evaluations/evaluator.py`` on the same features (goldens: ``third_party/guided_diffusion/
make_goldens.py``; its ``features`` and ``classifier`` rebuild the inputs here). Every bound is
derived from float32 / float16 / float64 roundoff and the problem size, stated beside it."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest

from dew.scoring import adm_evaluator as adm
from dew.scoring import distances, inception
from dew.scoring.adm_metrics import softmax
from dew.scoring.statistics import FeatureStatistics

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

HERE = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "guided_diffusion"
U32, U16, EPS64 = 2.0**-24, 2.0**-11, 2.0**-53


def _script():
    spec = importlib.util.spec_from_file_location("adm_goldens", HERE / "make_goldens.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make = _script()


@pytest.fixture(scope="module")
def golden():
    with np.load(HERE / "evaluator_goldens.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("kind,d", [("pool", 2048), ("spatial", 2023)])
def test_fid_and_sfid_are_the_evaluators(golden, kind, d):
    """The evaluator takes float32 means (``np.mean`` of float32 rows: pairwise sums, error ≤
    (⌈log₂ N⌉ + 1)·u₃₂·max|x| per coordinate) where dew's are float64; its Tr (Σ₁Σ₂)^{1/2} is
    ``sqrtm`` (Schur) where dew's is ``eigh``: both backward stable, eigenvalues of the product
    moved by δ ≤ D·ε₆₄·‖Σ₁‖‖Σ₂‖, and Σᵢ |√(λᵢ + δ) − √λᵢ| ≤ D·√δ, for each algorithm."""
    a, b = make.features(f"{kind}/ref", 3000, d), make.features(f"{kind}/sample", 2500, d)
    sa, sb = FeatureStatistics().update(a), FeatureStatistics().update(b)
    got = distances.frechet_distance(sb.mu, sb.sigma, sa.mu, sa.sigma)
    want = float(golden[f"fid/{kind}"])
    mean_error = (math.ceil(math.log2(3000)) + 1) * U32 * max(np.abs(a).max(), np.abs(b).max())
    diff = np.linalg.norm(sb.mu - sa.mu)
    delta = np.sqrt(d) * mean_error * 2  # ‖δμ₁ − δμ₂‖ over d coordinates
    norms = np.linalg.norm(sa.sigma, 2) * np.linalg.norm(sb.sigma, 2)
    bound = 2 * diff * delta + delta**2 + 2 * 2 * d * np.sqrt(d * EPS64 * norms)
    assert abs(got - want) <= bound, (got, want, bound)
    assert bound < 1e-2 * want  # the bound is tight enough to tell a wrong statistic
    np.testing.assert_allclose(sb.mu, golden[f"fid/{kind}/mu"], rtol=0, atol=mean_error * 2)


def _softmax_rows(pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """dew's softmax of ``pool @ (scale · fc.weight).T`` and the per-row bound on |Δ logit|
    against TF's float32 matmul of the same inputs (γ₂₀₄₈·Σ|p||w| for each side)."""
    w = make.classifier()
    logits = np.asarray(inception.logits(jnp.asarray(pool), w))
    return softmax(logits), 2 * 2048 * U32 * (np.abs(pool) @ np.abs(w).T).max(1)


def test_inception_score_is_the_evaluators(golden):
    """p = softmax(ℓ): a logit error ≤ Δ moves every p by a factor within e^{±2Δ} (plus 4u₃₂ for
    the exponent and division); the evaluator's float32 KL steps run identically on both sides,
    so |ΔKL| ≤ e·(A + 2) with e the relative error of p and A = max_i Σ_y |p (log p − log p̄)|,
    plus each side's float32 summation (1008 classes, then the split's rows: γ·A); IS = exp(mean KL)."""
    pool = make.features("is/pool", 3000, 2048)
    probabilities, logit_error = _softmax_rows(pool)
    e = 2 * logit_error.max() + 4 * U32
    head = golden["is/softmax_head"]
    assert np.all(np.abs(probabilities[:64] - head) <= head * (np.expm1(e) + 1e-30) + 1e-45)
    for key, split in (("is/default", adm.SPLIT_SIZE), ("is/split700", 700)):
        got, want = adm.inception_score(probabilities, split_size=split), float(golden[key])
        p = probabilities.astype(np.float64)
        a = np.max(np.sum(np.abs(p * (np.log(p) - np.log(p.mean(0)))), 1))
        bound = want * (e * (a + 2) + 2 * (1008 + split) * U32 * (a + 1))
        assert abs(got - want) <= bound, (key, got, want, bound)
        assert want > 1.3  # a score that is not trivially 1
    assert adm.inception_score(probabilities, 700) != adm.inception_score(probabilities)  # splits differ
    assert float(golden["is/split700"]) != float(golden["is/default"])


def _ulp16(x: np.ndarray) -> np.ndarray:
    """The float16 spacing at |x| (next binade up, covering values on either side of a power of 2)."""
    x = np.maximum(np.abs(x) * (1 + 2.0**-9), 2.0**-14)
    return 2.0 ** (np.floor(np.log2(x)) - 10)


def _distance_bound(u: np.ndarray, v: np.ndarray, f16: bool) -> np.ndarray:
    """|dew − evaluator| for one pair's squared distance from the same float16-cast inputs: each
    side rounds ‖u‖², uᵀv (×2 exact), ‖u‖² − 2uᵀv and the sum to float16 (½ulp each) after
    float32 sums of ≤ 2048 non-negative terms (γ₂₀₄₈·value); float32 path: γ₂₀₅₁·(‖u‖² + 2|uᵀv| + ‖v‖²)."""
    cast = (lambda x: x.astype(np.float16).astype(np.float64)) if f16 else (lambda x: x.astype(np.float64))
    u, v = cast(u), cast(v)
    nu, nv, mm = (u * u).sum(1)[:, None], (v * v).sum(1)[None, :], u @ v.T
    gamma = 2051 * U32
    if not f16:
        return 2 * gamma * (nu + 2 * np.abs(mm) + nv)
    partial = nu - 2 * mm
    one_side = 0.5 * (
        _ulp16(nu) + 2 * _ulp16(mm) + _ulp16(partial) + _ulp16(partial + nv) + _ulp16(nv)
    ) + gamma * (nu + 2 * np.abs(mm) + nv)
    return 2 * one_side


@pytest.mark.parametrize("case,scale", [("pr", 1.0), ("pr_f32", 16.0)])
def test_distances_radii_precision_and_recall_are_the_evaluators(golden, case, scale):
    """Distances within ``_distance_bound``; radii (an order statistic of a row) within the
    row's largest bound; precision/recall differ by at most the share of points with a
    comparison d ≤ r within (its bound + the radius' bound) of flipping (counted from the
    evaluator's own distances and radii). That last bound is weak (most points: 2048-d
    distances concentrate, and float16 resolves them to ~0.1%, in the evaluator as here), so
    the rules themselves are checked exactly on the evaluator's distances in the next test.
    Measured on this CPU: the float32 path gives the
    evaluator's precision and recall exactly; the float16 path 0.8333 / 0.8575 against its 0.84 /
    0.855 (2 of 300 samples, 1 of 400 reference points on the other side of a radius; TF's
    float16 ``reduce_sum`` rounds in an order of its own, and the evaluator on a GPU rounds in
    yet another), inside the bound."""
    ref, sample = make.features("pr/ref", 400, 2048, scale), make.features("pr/sample", 300, 2048, scale)
    f16 = case == "pr"
    want = golden[f"{case}/distances"]
    got = adm.pairwise_distances(ref, sample)
    bound = _distance_bound(ref, sample, f16)
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)
    with np.errstate(over="ignore"):
        assert (want.astype(np.float16).astype(np.float32) == want).all() == f16  # the path taken
        assert (got.astype(np.float16).astype(np.float32) == got).all() == f16  # and dew's
    estimator = adm.ManifoldEstimator()
    radii_ref, radii_sample = estimator.manifold_radii(ref), estimator.manifold_radii(sample)
    row_ref = _distance_bound(ref, ref, f16).max(1)[:, None]
    row_sample = _distance_bound(sample, sample, f16).max(1)[:, None]
    assert np.all(np.abs(radii_ref - golden[f"{case}/radii_ref"]) <= row_ref)
    assert np.all(np.abs(radii_sample - golden[f"{case}/radii_sample"]) <= row_sample)
    precision, recall = adm.precision_recall(ref, sample)
    near_ref = np.abs(want - golden[f"{case}/radii_ref"]) <= bound + row_ref  # [ref, sample]
    near_sample = np.abs(want - golden[f"{case}/radii_sample"][:, 0][None, :]) <= bound + row_sample.T
    assert abs(precision - golden[f"{case}/precision"][0]) <= near_ref.any(0).mean()
    assert abs(recall - golden[f"{case}/recall"][0]) <= near_sample.any(1).mean()
    assert 0.5 < precision < 1 and 0.5 < recall < 1  # neither trivially 0 nor 1


@pytest.mark.parametrize("case", ["pr", "pr_f32"])
@pytest.mark.parametrize("blocks", [(10_000, 10_000), (128, 96), (7, 300)])
def test_on_the_evaluators_distances_and_radii_precision_and_recall_are_exactly_its(golden, case, blocks):
    """The rules (blocks, ``d ≤ r``, any over the other set, mean), separated from the float16
    arithmetic: given the evaluator's own distances (looked up by index) and radii, dew's
    ``evaluate_pr`` gives its precision and recall exactly, in any blocking."""
    distances = golden[f"{case}/distances"]

    def lookup(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return distances[rows[:, 0]][:, cols[:, 0]]

    estimator = adm.ManifoldEstimator(*blocks, distances=lookup)
    precision, recall = estimator.evaluate_pr(
        np.arange(400)[:, None],
        golden[f"{case}/radii_ref"],
        np.arange(300)[:, None],
        golden[f"{case}/radii_sample"],
    )
    assert precision[0] == golden[f"{case}/precision"][0] and recall[0] == golden[f"{case}/recall"][0]
    # k = 3 radii on a matrix whose rows are known: itself (0) first, then the 3rd other point
    square = np.abs(np.arange(9.0)[:, None] - np.arange(9.0)[None, :]).astype(np.float32)
    radii = adm.ManifoldEstimator(*blocks, distances=lambda r, c: square[r[:, 0]][:, c[:, 0]]).manifold_radii(
        np.arange(9)[:, None]
    )
    np.testing.assert_array_equal(radii[:, 0], [3, 2, 2, 2, 2, 2, 2, 2, 3])


@pytest.fixture(scope="module")
def float32_golden():
    with np.load(HERE / "pr_float32_goldens.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _flip_share(distances: np.ndarray, radii: np.ndarray, tol: float, axis: int) -> float:
    """The share of points (along the other ``axis``) with a comparison d ≤ r within a relative
    ``tol`` of flipping (|d − r| ≤ tol·(d + r))."""
    return float((np.abs(distances - radii) <= tol * (distances + radii)).any(axis).mean())


def test_float32_arithmetic_is_the_evaluators_float32_branch(float32_golden):
    """``arithmetic="float32"`` against the evaluator's own code with every block on its float32
    branch (``make_float32_goldens.py``), on features it would otherwise take in float16.

    Distances: within ``_distance_bound``'s float32 case (γ₂₀₅₁ per side: TF-CPU's Eigen matmul
    and NumPy's BLAS sum in different orders). That a-priori bound is ~100 times the measured
    difference (5.5e-6 relative, 1.6e-3 on values ~270), and on 2048-d features distances
    concentrate near the radii, so as a precision/recall allowance it would excuse 30-80 % of the
    points. The allowance is therefore the platform difference as measured: ``TOL`` = 4 × the
    largest relative distance difference on the stored matrix (checked on every distance, and on
    the radii); precision and recall may differ by the share of points with a comparison within
    ``TOL`` of flipping (0.3 % / 1.3 % here, 2.0 % / 1.5 % on the larger sets). Measured: equal,
    0.83 / 0.8375, and 0.748 / 0.7607 on 1,500 / 1,500 overlapping points. The float16 default
    gives other numbers on the same points (0.8333 / 0.8575; 0.7667 / 0.7827)."""
    g = float32_golden
    ref, sample = make.features("pr/ref", 400, 2048), make.features("pr/sample", 300, 2048)
    got, want = adm.pairwise_distances(ref, sample, arithmetic="float32"), g["f32/distances"]
    bound = _distance_bound(ref, sample, f16=False)
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)
    tol = 4 * float((np.abs(got - want) / want).max())
    assert tol < 1e-4  # float32 roundoff, not another arithmetic (float16 would be ~1e-3)
    estimator = adm.ManifoldEstimator(arithmetic="float32")
    for features, key in ((ref, "f32/radii_ref"), (sample, "f32/radii_sample")):
        np.testing.assert_allclose(estimator.manifold_radii(features), g[key], rtol=tol)
    precision, recall = adm.precision_recall(ref, sample, arithmetic="float32")
    assert abs(precision - g["f32/precision"][0]) <= _flip_share(want, g["f32/radii_ref"], tol, 0)
    assert abs(recall - g["f32/recall"][0]) <= _flip_share(want, g["f32/radii_sample"][:, 0][None, :], tol, 1)
    assert (precision, recall) != adm.precision_recall(ref, sample)  # the float16 default differs here

    big_ref, big_sample = make.features("pr32/ref", 1500, 2048), make.features("pr32/sample", 1500, 2048)
    precision, recall = adm.precision_recall(big_ref, big_sample, arithmetic="float32")
    d = adm.pairwise_distances(big_ref, big_sample, arithmetic="float32")
    radii_ref, radii_sample = estimator.manifold_radii(big_ref), estimator.manifold_radii(big_sample)
    np.testing.assert_allclose(radii_ref, g["f32_large/radii_ref"], rtol=tol)
    np.testing.assert_allclose(radii_sample, g["f32_large/radii_sample"], rtol=tol)
    assert abs(precision - g["f32_large/precision"][0]) <= _flip_share(d, radii_ref, tol, 0)
    assert abs(recall - g["f32_large/recall"][0]) <= _flip_share(d, radii_sample.T, tol, 1)
    with pytest.raises(ValueError, match="arithmetic='float64'"):
        adm.precision_recall(ref, sample, arithmetic="float64")


def test_the_suites_scores_take_the_arithmetic_asked_for_precision_and_recall():
    """``feature_set.score_sets`` (what ``python -m dew.fid --pr_arithmetic`` reaches) computes
    precision and recall in the arithmetic it is given: on points where the two arithmetics
    disagree (the float32 golden test's), float32 gives ``precision_recall``'s float32 numbers
    exactly, and the default stays the evaluator's float16 graph."""
    from dew.scoring.feature_set import FeatureSet, score_sets

    ref, sample = make.features("pr/ref", 400, 2048), make.features("pr/sample", 300, 2048)
    samples = FeatureSet.of_adm({}, lambda: sample)
    reference = FeatureSet.of_adm({}, lambda: ref)

    def suite(*arithmetic: str) -> tuple[float, float]:
        got = score_sets(("precision", "recall"), samples, reference, *arithmetic)
        return got["precision"], got["recall"]

    float16, float32 = (
        adm.precision_recall(ref, sample),
        adm.precision_recall(ref, sample, arithmetic="float32"),
    )
    assert float16 != float32
    assert suite("float32") == float32
    assert suite() == suite("float16") == float16


def test_the_evaluators_blocks_give_its_numbers(golden):
    """Rows and columns in blocks of 128 × 96 (the evaluator's loops, a block's float16/float32
    choice its own) give what the whole matrix gives, as in the evaluator."""
    ref, sample = make.features("pr/ref", 400, 2048), make.features("pr/sample", 300, 2048)
    small = adm.ManifoldEstimator(row_batch_size=128, col_batch_size=96)
    assert adm.precision_recall(ref, sample, small) == adm.precision_recall(ref, sample)
    assert golden["pr_blocks/precision"] == golden["pr/precision"]
    np.testing.assert_array_equal(small.manifold_radii(ref), adm.ManifoldEstimator().manifold_radii(ref))
    # a block holding one overflowing pair takes the float32 path for all of it
    wide = ref[:4].copy()
    wide[0] *= 16
    d = adm.pairwise_distances(wide, ref[:5])
    assert np.isfinite(d).all() and (d[1:].astype(np.float16).astype(np.float32) != d[1:]).any()


def test_the_evaluators_reference_batch_reads_here(golden, tmp_path):
    batch = adm.read_reference_batch(str(HERE / "reference_batch.npz"))
    np.testing.assert_array_equal(batch["mu"], golden["batch/mu"])
    np.testing.assert_array_equal(batch["mu_s"], golden["batch/mu_s"])
    assert batch["resolution"] == (12, 10) and batch["num_images"] == 6 and "pool" not in batch
    images = np.concatenate(list(batch["images"].batches(4)))
    np.testing.assert_array_equal(images, golden["batch/read_batches_4"])
    # and dew's own batch: ADM's keys (arr_0, mu, sigma, mu_s, sigma_s) plus dew's
    out = tmp_path / "mine.npz"
    stats = {k: batch[k] for k in ("mu", "sigma", "mu_s", "sigma_s")}
    adm.write_reference_batch(
        str(out),
        images=images,
        pool=np.ones((6, 2048), np.float32),
        stats=stats,
        resolution=(12, 10),
        detector="d",
    )
    with np.load(out, allow_pickle=False) as data:
        assert {"arr_0", "mu", "sigma", "mu_s", "sigma_s"} <= set(data.files)
        assert data["arr_0"].dtype == np.uint8 and data["mu"].dtype == np.float64
    back = adm.read_reference_batch(str(out))
    assert back["pool"].shape == (6, 2048) and back["detector"] == "d" and back["resolution"] == (12, 10)


@pytest.mark.parametrize(
    "arrays,message",
    [
        ({"mu": np.zeros(3)}, r"member 'mu' has shape \(3,\); expected float \[2048\]"),
        ({"resolution": np.array([4, 4])}, "an ADM reference batch holds arr_0"),
        (
            {"arr_0": np.zeros((2, 4, 4), np.uint8)},
            r"member 'arr_0' has shape \(2, 4, 4\); expected uint \[N, H, W, 3\]",
        ),
        ({"arr_0": np.zeros((2, 4, 4, 3), np.float32)}, "member 'arr_0' is float32"),
        ({"arr_0": np.zeros((2, 4, 4, 3), np.uint16)}, "arr_0 is uint16"),
        (
            {"arr_0": np.zeros((2, 4, 4, 3), np.uint8), "mu": np.zeros(5), "sigma": np.eye(5)},
            r"member 'mu' has shape \(5,\); expected float \[2048\]",
        ),
        (
            {"pool": np.zeros((3, 7), np.float32)},
            r"member 'pool' has shape \(3, 7\); expected float \[N, 2048\]",
        ),
        # what an attack round found: each was a traceback, or a score from garbage
        ({"mu": np.zeros(2048)}, "holds mu without sigma; expected both or neither"),
        ({"sigma_s": np.eye(2023)}, "holds sigma_s without mu_s"),
        (
            {"arr_0": np.zeros((2, 4, 4, 3), np.uint8), "num_images": np.array([2, 2])},
            r"member 'num_images' has shape \(2,\); expected int/uint \[\]",
        ),
        (
            {"arr_0": np.zeros((2, 16, 16, 3), np.uint8), "resolution": np.array([8, 8])},
            "records resolution 8x8, its arr_0 holds 16x16 images",
        ),
        ({"pool": np.full((5, 2048), np.nan, np.float32)}, "pool holds feature rows that are not finite"),
        (
            {"arr_0": np.zeros((4, 4, 4, 3), np.uint8), "mu": np.full(2048, np.inf), "sigma": np.eye(2048)},
            "mu holds values that are not finite",
        ),
        ({"arr_0": np.zeros((1, 4, 4, 3), np.uint8)}, "holds 1 images; statistics need at least 2"),
        ({"arr_0": np.zeros((0, 4, 4, 3), np.uint8)}, "holds 0 images; statistics need at least 2"),
        ({"pool": np.zeros((1, 2048), np.float32)}, "holds 1 images; statistics need at least 2"),
        (
            {"arr_0": np.zeros((3, 4, 4, 3), np.uint8), "pool": np.zeros((2, 2048), np.float32)},
            r"member 'pool' has shape \(2, 2048\) \(N=3 elsewhere\)",
        ),
    ],
)
def test_a_malformed_reference_batch_is_one_line(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(adm.ReferenceBatchError, match=message) as refused:
        adm.read_reference_batch(str(path))
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)


def test_a_garbage_or_damaged_arr_0_is_one_line(tmp_path):
    """A member that is not a .npy array, and a flipped byte in the images (found by their
    CRC-32 as they are streamed), are one line naming the member."""
    path = tmp_path / "garbage.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("arr_0.npy", b"this is not an array" * 10)
    with pytest.raises(
        adm.ReferenceBatchError, match=r"member 'arr_0' cannot be read \(ValueError: the magic"
    ):
        adm.read_reference_batch(str(path))
    path = tmp_path / "flipped.npz"
    np.savez(path, arr_0=np.arange(4 * 8 * 8 * 3, dtype=np.uint8).reshape(4, 8, 8, 3))
    data = bytearray(path.read_bytes())
    data[data.index(b"\x00\x01\x02\x03") + 100] ^= 0xFF  # inside the images, past the header
    path.write_bytes(bytes(data))
    with pytest.raises(adm.ReferenceBatchError, match=r"arr_0'? cannot be read \(BadZipFile: Bad CRC-32"):
        list(adm.read_reference_batch(str(path))["images"].batches(3))  # a small entry: at its header
