"""Post-hoc EMA math against EDM2's equations and NVlabs/edm2's own numbers (no PyTorch here)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from dew.averaging import posthoc as ph

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

REF = np.load(pathlib.Path(__file__).resolve().parent.parent / "third_party" / "edm2" / "phema_reference.npz")


def test_sigma_rel_gamma_conversions_match_edm2():
    np.testing.assert_allclose(ph.gamma_to_std_rel(REF["exp_to_std/exp"]), REF["exp_to_std/std"], rtol=1e-12)
    # edm2 takes the largest real root of Eq. 126 with np.roots (companion-matrix eigenvalues,
    # ~1e-13 relative); dew by Newton: both are float64 roots of the same cubic.
    np.testing.assert_allclose(ph.std_rel_to_gamma(REF["std_to_exp/std"]), REF["std_to_exp/exp"], rtol=1e-9)
    # and the two conversions invert each other
    g = ph.std_rel_to_gamma(REF["std_to_exp/std"])
    np.testing.assert_allclose(ph.gamma_to_std_rel(g), REF["std_to_exp/std"], rtol=1e-12)


def test_per_update_beta_matches_edm2():
    for std in ("0.050", "0.100"):
        gamma = float(ph.std_rel_to_gamma(float(std)))
        for t_key, b_key, dt in (("t", "dt1", 1.0), ("dt64_t", "dt64", 64.0)):
            got = np.asarray(ph.power_beta(gamma, REF[f"beta/{std}/{t_key}"], dt), np.float64)
            # float32 inside the step: exp((γ+1)·log1p(−Δt/t)) is good to a few float32 ulps.
            np.testing.assert_allclose(got, REF[f"beta/{std}/{b_key}"], rtol=1e-6, atol=1e-7)


def test_response_and_inner_products_match_edm2():
    for i in range(4):
        ofs, std, length = REF[f"response/{i}/args"]
        got = ph.profile_weights(ofs, std, int(length))
        np.testing.assert_allclose(got, REF[f"response/{i}/resp"], rtol=1e-9, atol=1e-12)
    got = ph.profile_inner_product(
        REF["correlation/a_ofs"], REF["correlation/a_std"], REF["correlation/b_ofs"], REF["correlation/b_std"]
    )
    np.testing.assert_allclose(got, REF["correlation/value"], rtol=1e-9)


@pytest.mark.parametrize("name", ["digits", "edm2_images", "irregular", "sparse"])
def test_reconstruction_weights_match_edm2(name):
    got = ph.solve_coefficients(
        REF[f"solve/{name}/t_in"],
        REF[f"solve/{name}/sigma_in"],
        REF[f"solve/{name}/t_out"],
        REF[f"solve/{name}/sigma_out"],
    )
    np.testing.assert_allclose(got, REF[f"solve/{name}/coef"], atol=1e-6)
    np.testing.assert_allclose(got.sum(0), 1.0, atol=1e-12)


def test_inner_product_is_the_integral_of_the_profiles():
    """Eq. 151 against a direct quadrature of p_a·p_b (Eq. 121), so the closed form is checked
    independently of edm2. Midpoint rule on 2e5 cells of [0, max t]: error O(h²·max|f''|) is far
    below 1e-4 relative for these smooth polynomials (γ ≤ ~17)."""
    for (ta, sa), (tb, sb) in [
        ((1.0, 0.05), (1.0, 0.10)),
        ((0.4, 0.07), (1.0, 0.12)),
        ((1.0, 0.2), (0.7, 0.05)),
    ]:
        ga, gb = ph.std_rel_to_gamma(sa), ph.std_rel_to_gamma(sb)
        edges = np.linspace(0.0, max(ta, tb), 200_001)
        tau = 0.5 * (edges[1:] + edges[:-1])
        pa = np.where(tau <= ta, (ga + 1) * tau**ga / ta ** (ga + 1), 0.0)
        pb = np.where(tau <= tb, (gb + 1) * tau**gb / tb ** (gb + 1), 0.0)
        integral = np.sum(pa * pb) * (edges[1] - edges[0])
        np.testing.assert_allclose(ph.profile_inner_product(ta, sa, tb, sb), integral, rtol=1e-4)


def test_tracked_power_ema_has_the_telescoped_weights():
    """The recursion with β_γ(n) (Eq. 127) from n = 1 puts weight (1 − ((k−1)/k)^(γ+1))(k/n)^(γ+1)
    on θ_k: compare a tracked scalar sequence with that explicit sum (float32 tracking over 300
    steps of O(1) values: round-off ~300·6e-8)."""
    gamma = float(ph.std_rel_to_gamma(0.1))
    thetas = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    ema = np.float32(123.0)  # anything: the first update (β = 0) replaces it
    for n, theta in enumerate(thetas, start=1):
        ema = ph.power_update(ema, theta, gamma, n)
    k = np.arange(1, 301, dtype=np.float64)
    weights = (1 - ((k - 1) / k) ** (gamma + 1)) * (k / 300) ** (gamma + 1)
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(float(ema), float(weights @ thetas.astype(np.float64)), atol=1e-4)


def test_reconstruction_recovers_a_tracked_profile():
    """Track three power EMAs of a scalar 'parameter' trajectory; snapshot two of them on a
    schedule; reconstruct the third post hoc. The least-squares profile match is approximate, so
    the bound compares the errors: the reconstruction must be much closer to the directly
    tracked EMA than either tracked input is (a factor 10 on a trajectory where the widths
    matter)."""
    n, every = 2000, 100
    target = 0.07
    sigmas = (0.05, 0.10, target)
    gammas = [float(ph.std_rel_to_gamma(s)) for s in sigmas]
    t = np.arange(1, n + 1)
    theta = np.sin(t / 150.0) + 0.002 * t  # drifting, oscillating parameter
    emas = [np.float64(0.0)] * 3
    snapshots = []
    for step, value in zip(t, theta, strict=True):
        emas = [
            float(ph.power_update(np.float32(e), np.float32(value), g, int(step)))
            for e, g in zip(emas, gammas, strict=True)
        ]
        if step % every == 0:
            snapshots += [
                ph.Snapshot(int(step), s, {"w": np.float32(e)})
                for s, e in zip(sigmas[:2], emas[:2], strict=True)
            ]
    got = float(ph.reconstruct(snapshots, target)["w"])
    err = abs(got - emas[2])
    assert err < 0.1 * min(abs(emas[0] - emas[2]), abs(emas[1] - emas[2])), (got, emas)


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match=r"std_rel=\[0.3\]"):
        ph.std_rel_to_gamma(0.3)
    with pytest.raises(ValueError, match="not the time of a snapshot"):
        ph.reconstruct([ph.Snapshot(10, 0.05, {"w": np.zeros(2)})], 0.07, t=5)
    with pytest.raises(ValueError, match="distinct"):
        ph.parse_std_rels([0.05, 0.0501], "config.ema.power_std_rels")
