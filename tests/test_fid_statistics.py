"""Streaming feature statistics, FID and KID against closed forms and scipy."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import scipy.linalg

from dew.scoring import distances
from dew.scoring.statistics import FeatureStatistics, feature_statistics, load_statistics

EPS = np.finfo(np.float64).eps


def _batches(x: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    edges = np.cumsum([0, *sizes])
    assert edges[-1] == len(x)
    return [x[a:b] for a, b in itertools.pairwise(edges)]


def test_streaming_matches_one_pass_numpy_over_uneven_batches():
    rng = np.random.default_rng(0)
    # a large common offset: the naive E[xxᵀ] − μμᵀ would cancel the covariance away
    x = 1e4 + rng.standard_normal((1000, 16)) @ rng.standard_normal((16, 16))
    stats = FeatureStatistics()
    for batch in _batches(x, [1, 2, 97, 300, 600]):
        stats.update(batch)
    assert stats.count == 1000
    # float64 throughout: agreement to a few hundred ulps of the entries' scale
    np.testing.assert_allclose(stats.mu, x.mean(0), rtol=1e-13)
    np.testing.assert_allclose(stats.sigma, np.cov(x, rowvar=False), atol=1e-10 * np.abs(np.cov(x.T)).max())


def test_streaming_sharded_jax_batches_over_a_mesh():
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    rng = np.random.default_rng(1)
    x = (50.0 + rng.standard_normal((8 * 40, 12)) * rng.uniform(0.1, 3, 12)).astype(np.float32)
    stats = FeatureStatistics(keep_features=100)
    for batch in _batches(x, [64, 128, 128]):
        stats.update(jax.device_put(batch, sharding))
    ref = x.astype(np.float64)
    # each batch is reduced in float32 on the devices after centring: relative error ~1e-6 of
    # the covariance scale (float32 ε·√n), merged in float64
    np.testing.assert_allclose(stats.mu, ref.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats.sigma, np.cov(ref, rowvar=False), atol=1e-5 * np.cov(ref.T).max())
    np.testing.assert_array_equal(stats.features, x[:100])


def _exact_sample(rng, n: int, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """n rows whose sample mean and (unbiased) sample covariance are exactly mu and sigma."""
    z = rng.standard_normal((n, len(mu)))
    z -= z.mean(0)
    z = z @ np.linalg.inv(np.linalg.cholesky(np.cov(z, rowvar=False))).T  # sample cov = I
    return mu + z @ np.linalg.cholesky(sigma).T


def test_fid_of_sampled_gaussians_equals_the_closed_form():
    """Σ_b = c Σ_a⁻¹ does not commute with a generic Σ_a, yet Tr (Σ_a Σ_b)^{1/2} = D √c: the
    whole pipeline (streamed moments → FD) must give ‖Δμ‖² + Tr Σ_a + Tr Σ_b − 2D√c. Samples are
    constructed with exactly these moments, so only float64 round-off separates the two
    (bound: 1e-9 relative, ~1e4 ulps through Cholesky, inverse and eigh of D=24 matrices)."""
    rng = np.random.default_rng(2)
    d, c = 24, 2.5
    a = rng.standard_normal((d, d))
    sigma_a = a @ a.T / d + 0.5 * np.eye(d)
    sigma_b = c * np.linalg.inv(sigma_a)
    mu_a, mu_b = rng.standard_normal(d), rng.standard_normal(d)
    exact = np.sum((mu_a - mu_b) ** 2) + np.trace(sigma_a) + np.trace(sigma_b) - 2 * d * np.sqrt(c)
    xa, xb = _exact_sample(rng, 500, mu_a, sigma_a), _exact_sample(rng, 300, mu_b, sigma_b)
    sa, sb = FeatureStatistics(), FeatureStatistics()
    for batch in _batches(xa, [100, 250, 150]):
        sa.update(batch)
    for batch in _batches(xb, [300]):
        sb.update(batch)
    got = distances.frechet_distance(sa.mu, sa.sigma, sb.mu, sb.sigma)
    np.testing.assert_allclose(got, exact, rtol=1e-9)
    # identical statistics are at distance zero (up to round-off of the traces)
    assert abs(distances.frechet_distance(sa.mu, sa.sigma, sa.mu, sa.sigma)) < 1e-10 * np.trace(sigma_a)


def _scipy_fid(mu_a, sigma_a, mu_b, sigma_b, eps=1e-6):
    """The usual recipe (pytorch-fid): scipy sqrtm of the product, ε·I offset if not finite."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        covmean = scipy.linalg.sqrtm(sigma_a @ sigma_b)
        if not np.isfinite(covmean).all():
            offset = np.eye(len(mu_a)) * eps
            covmean = scipy.linalg.sqrtm((sigma_a + offset) @ (sigma_b + offset))
    diff = mu_a - mu_b
    return float(diff @ diff + np.trace(sigma_a) + np.trace(sigma_b) - 2 * np.trace(np.real(covmean)))


@pytest.mark.parametrize("d,null,decades", [(64, 16, 0), (200, 100, 10), (256, 64, 8)])
def test_fid_on_near_singular_covariances_vs_closed_form_and_scipy(d, null, decades):
    """Shared eigenvectors U, eigenvalues spanning `decades` decades, `null` exact zeros in
    each (shifted: dead units differ between the sets): FD = Σ (√a_i − √b_i)² exactly. A null
    direction's eigenvalue is only known to ±D·ε·‖Σ‖ after rounding (Σ = U diag Uᵀ and the
    products are D-term sums), and √ of that is ~√(D·ε·‖Σ‖) per direction; at most 2·null such
    directions in the product: bound 2·(2·null)·√(D·ε·‖Σ‖) plus 1e-10 relative, for dew and for
    scipy alike."""
    rng = np.random.default_rng(d)
    u, _ = np.linalg.qr(rng.standard_normal((d, d)))
    a, b = 10 ** rng.uniform(-decades, 2, d), 10 ** rng.uniform(-decades, 2, d)
    a[:null], b[null // 2 : null + null // 2] = 0.0, 0.0
    sigma_a, sigma_b = (u * a) @ u.T, (u * b) @ u.T
    exact = float(np.sum((np.sqrt(a) - np.sqrt(b)) ** 2))
    zero = np.zeros(d)
    got = distances.frechet_distance(zero, sigma_a, zero, sigma_b)
    bound = 4 * null * np.sqrt(d * EPS * 100.0) + 1e-10 * exact  # ‖Σ‖ ≤ 100
    assert abs(got - exact) < bound, (got, exact, bound)
    assert abs(_scipy_fid(zero, sigma_a, zero, sigma_b) - exact) < bound  # both fine here


def test_the_trace_term_equals_the_nuclear_norm_of_the_root_product():
    """Tr (Σ_a Σ_b)^{1/2} two ways: Σ √λ(Σ_a^{1/2} Σ_b Σ_a^{1/2}) (dew) and the nuclear norm of
    Σ_a^{1/2} Σ_b^{1/2} (both are Σ of the singular values of Σ_a^{1/2} Σ_b^{1/2}). Each is a sum
    of D terms, each known to ~D·ε·‖Σ‖; they agree to 2·D²·ε·‖Σ‖ relative to the trace."""
    rng = np.random.default_rng(7)
    d = 300
    x, y = rng.standard_normal((2 * d, d)), rng.standard_normal((2 * d, d)) @ rng.standard_normal((d, d))
    sigma_a, sigma_b = np.cov(x, rowvar=False), np.cov(y, rowvar=False) / d
    nuclear = np.sum(
        np.linalg.svd(distances.sqrtm_psd(sigma_a) @ distances.sqrtm_psd(sigma_b), compute_uv=False)
    )
    got = distances.trace_sqrt_product(sigma_a, sigma_b)
    scale = max(np.linalg.norm(sigma_a, 2), np.linalg.norm(sigma_b, 2))
    assert abs(got - nuclear) <= 2 * d * d * EPS * scale * max(1.0, nuclear), (got, nuclear)


def test_fid_of_nearly_identical_distributions_within_the_eigenvalue_rounding_bound():
    """Σ_b = (1 + s) Σ_a: FD = Tr Σ_a (2 + s − 2√(1+s)) ≈ 1e-6 against traces ~1e3, so the
    answer is a cancellation. The eigenvalues λ_i = a_i²(1+s) of Σ_b^{1/2} Σ_a Σ_b^{1/2} are known
    to δ = D·ε·max λ after rounding, and √ turns that into min(√δ, δ/(2√λ_i)) each: dew must be
    within twice their sum (plus the traces' own round-off). How close scipy's sqrtm of the
    product comes is not asserted: which of the two rounds closer to the exact value depends on
    the CPU's BLAS/LAPACK kernels (scipy was the closer on an AVX-512 Intel Xeon, dew on the
    AMD machines the suite ran on before)."""
    rng = np.random.default_rng(3)
    d, s = 64, 1e-4
    u, _ = np.linalg.qr(rng.standard_normal((d, d)))
    a = 10 ** rng.uniform(-3, 2, d)
    sigma_a = (u * a) @ u.T
    sigma_b = sigma_a * (1 + s)
    exact = float(np.sum(a) * (2 + s - 2 * np.sqrt(1 + s)))
    zero = np.zeros(d)
    err = abs(distances.frechet_distance(zero, sigma_a, zero, sigma_b) - exact)
    lam = a**2 * (1 + s)
    delta = d * EPS * lam.max()
    bound = 2 * np.sum(np.minimum(np.sqrt(delta), delta / (2 * np.sqrt(lam)))) + d * EPS * 2 * np.sum(a)
    assert bound < exact / 2  # the bound resolves the cancelled answer: FD is known to a factor < 2
    assert err < bound, (err, bound)


def test_unbiased_mmd_equals_the_double_sum():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((7, 3)), rng.standard_normal((7, 3)) + 0.5
    k = lambda p, q: (p @ q / 3 + 1) ** 3  # noqa: E731
    m = 7
    xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(m)) / m**2
    np.testing.assert_allclose(distances.mmd2_unbiased(x, y), xx + yy - 2 * xy, rtol=1e-12)


def test_kid_is_unbiased_for_gaussians_with_a_closed_form():
    """For zero-mean x ~ N(0, Σ_a), y ~ N(0, Σ_b) and k = (xᵀy/D + 1)³, odd moments vanish and
    E k(x, y) = 1 + 3 Tr(Σ_a Σ_b)/D², so MMD² = 3‖Σ_a − Σ_b‖²_F / D². The mean of 300 independent
    unbiased estimates must lie within 4 standard errors of it (estimated from the draws)."""
    rng = np.random.default_rng(5)
    d = 4
    sigma_a, sigma_b = np.eye(d), np.diag([2.0, 2.0, 1.0, 0.5])
    exact = 3 * np.sum((sigma_a - sigma_b) ** 2) / d**2
    ra, rb = np.linalg.cholesky(sigma_a), np.linalg.cholesky(sigma_b)
    draws = [
        distances.mmd2_unbiased(rng.standard_normal((100, d)) @ ra.T, rng.standard_normal((100, d)) @ rb.T)
        for _ in range(300)
    ]
    se = np.std(draws) / np.sqrt(len(draws))
    assert abs(np.mean(draws) - exact) < 4 * se, (np.mean(draws), exact, se)
    # the same distribution: KID's mean over subsets is ~0 (not biased upwards like FD)
    same_a, same_b = rng.standard_normal((2000, d)), rng.standard_normal((2000, d))
    mean, std = distances.kernel_distance(same_a, same_b, subsets=50, subset_size=500)
    assert abs(mean) < 4 * std / np.sqrt(50) * np.sqrt(4), (mean, std)  # subsets overlap: ×√4 slack
    far, _ = distances.kernel_distance(same_a @ rb.T, same_b, subsets=50, subset_size=500)
    assert far > 10 * abs(mean)


def test_reference_statistics_npz_round_trip_and_errors(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((50, 5))
    stats = FeatureStatistics(keep_features=20).update(x)
    path = tmp_path / "ref.npz"
    stats.save(path)
    with np.load(path, allow_pickle=False) as raw:  # the layout other tools read
        assert set(raw.files) == {"mu", "sigma", "features"}
        assert raw["mu"].dtype == np.float64 and raw["sigma"].shape == (5, 5)
    back = load_statistics(path)
    np.testing.assert_array_equal(back["mu"], stats.mu)
    np.testing.assert_array_equal(back["sigma"], stats.sigma)
    assert back["features"].shape == (20, 5)
    mu, sigma = feature_statistics(x)
    np.testing.assert_allclose(sigma, np.cov(x, rowvar=False), rtol=1e-12)
    with pytest.raises(FileNotFoundError, match=r"missing\.npz"):
        load_statistics(tmp_path / "missing.npz")
    save_path = tmp_path / "bad.npz"
    np.savez(save_path, mu=mu)
    with pytest.raises(ValueError, match=r"lacking \['sigma'\]"):
        load_statistics(save_path)
    np.savez(save_path, mu=mu, sigma=np.where(np.eye(5) > 0, np.nan, sigma))  # never a Fréchet distance
    with pytest.raises(ValueError, match="sigma holds values that are not finite"):
        load_statistics(save_path)
    np.savez(save_path, mu=mu, sigma=sigma, num_images=np.int64(1))  # dew's references record it
    with pytest.raises(ValueError, match="record 1 images; a covariance needs at least 2"):
        load_statistics(save_path)
    with pytest.raises(ValueError, match="D=3, earlier batches had D=5"):
        stats.update(np.zeros((2, 3)))


def test_digit_fd_metric_uses_the_streaming_code():
    """The offline digits metric equals FD through FeatureStatistics on the same features."""
    import dew
    from dew.scoring import digits_features as df

    rng = np.random.default_rng(7)
    images = np.tanh(rng.standard_normal((64, 8, 8, 1)))
    feats = df.digit_features(images)
    streamed = df.streamed_digit_statistics([images[:10], images[10:]])
    real = FeatureStatistics().update(df._real_features())
    expected = distances.frechet_distance(streamed.mu, streamed.sigma, real.mu, real.sigma)
    np.testing.assert_allclose(dew.metrics["digits_frechet_distance"](images, None), expected, rtol=1e-9)
    np.testing.assert_allclose(streamed.mu, feats.mean(0), rtol=1e-12, atol=1e-12)
    assert dew.metrics["digits_kernel_distance"](images, None) > 0
