"""SiT's interpolants and samplers against willisma/SiT's own ``transport/`` (third_party/sit/):
training targets and losses for every path × prediction × weighting, the drift, score and
velocity conversions, the diffusion forms, torchdiffeq's euler/heun2/dopri5 trajectories and the
SDE samplers with the reference's noise draws injected.

Bounds are float32 roundoff, u = 2⁻²⁴, times a stated operation count, relative to the scale of
the values compared (``bound``): a formula of k float32 operations is off by at most ~k u of its
largest intermediate. A trajectory of n steps accumulates n such errors, each carried forward by
the flow; the fixed map's field has Lipschitz constant L ≤ ‖W‖(1 + ½ t) + the path's |α̇/α| terms,
so the carried error grows at most by e^{∫L dt}, which the bound takes from the trajectory's own
growth (max |x| along it over |x| at its start, the same exponent for a linear field).
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.diffusion.interpolants import PATHS, VPPath
from dew.diffusion.schedules import vp_sigma
from dew.diffusion.transport import Transport
from dew.sampling.transport_ode import TransportODE, torch_linspace
from dew.sampling.transport_sde import TransportSDE

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "sit" / "transport.npz"
U = 2.0**-24  # float32 unit roundoff
REPORT = False


@pytest.fixture(scope="module")
def ref():
    with np.load(GOLDEN, allow_pickle=False) as data:
        return dict(data)


def fixed_model(ref):
    """The golden's map: (flat(x) @ W) * (1 + t/2) + t c, as make_reference.py defines it."""
    W, c = jnp.asarray(ref["W"]), jnp.asarray(ref["c"])

    def model(x, t):
        b = x.shape[0]
        t4 = t.reshape(b, 1, 1, 1)
        return (x.reshape(b, -1) @ W).reshape(x.shape) * (1 + 0.5 * t4) + t4 * c

    return model


def assert_within(actual, expected, ops: float, scale: float | None = None, what: str = ""):
    """|actual − expected| <= ops · u · scale, scale defaulting to max |expected| (and 1)."""
    expected, actual = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    # A value the reference makes non-finite (Linear + velocity + SBDM divides by t = 0) must be
    # non-finite here too; the finite ones are compared.
    np.testing.assert_array_equal(np.isfinite(actual), np.isfinite(expected), err_msg=what)
    finite = np.isfinite(expected)
    expected, actual = expected[finite], actual[finite]
    if expected.size == 0:
        return
    scale = max(float(np.max(np.abs(expected))), 1.0) if scale is None else scale
    err = float(np.max(np.abs(actual - expected)))
    if REPORT:
        print(f"{what}: error/bound {err / (ops * U * scale):.3g}")
    assert err <= ops * U * scale, f"{what}: error {err:.3g} > bound {ops * U * scale:.3g} ({ops} ops)"


def growth(traj: np.ndarray) -> float:
    """max |x| along a trajectory over max |x| at its start (>= 1): e^{∫L} for a linear field."""
    traj = traj[np.all(np.isfinite(traj.reshape(traj.shape[0], -1)), axis=1)]
    if traj.shape[0] == 0:
        return 1.0
    return max(float(np.max(np.abs(traj))) / max(float(np.max(np.abs(traj[0]))), 1e-30), 1.0)


def assert_trajectory(actual, expected, ops_per_step: float, steps: int | None = None, what: str = ""):
    """Row i (the state after i steps, or ``steps`` for all rows of an adaptive run) within
    ops_per_step · i · u of the rows' scale so far, times their growth so far (``growth``)."""
    for i in range(1, expected.shape[0]):
        prefix = expected[: i + 1]
        finite = prefix[np.all(np.isfinite(prefix.reshape(i + 1, -1)), axis=1)]
        scale = max(float(np.max(np.abs(finite))), 1.0) if finite.size else 1.0
        n = i if steps is None else steps
        assert_within(
            actual[i], expected[i], ops_per_step * n * growth(prefix), scale, what=f"{what} row {i}"
        )


def test_create_transport_margins_and_intervals(ref):
    meta = json.loads(str(ref["meta_json"]))
    for row in meta["eps_rules"]:
        tr = Transport.create(row["path"], row["prediction"], None, row["train_eps_in"], row["sample_eps_in"])
        assert (tr.train_eps, tr.sample_eps) == pytest.approx((row["train_eps"], row["sample_eps"])), row
        for form, sde, ev, rev, lss, t0, t1 in row["intervals"]:
            got = tr.check_interval(diffusion_form=form, sde=sde, eval=ev, reverse=rev, last_step_size=lss)
            assert got == pytest.approx((t0, t1), abs=1e-12), (row["path"], row["prediction"], form, sde, ev)


@pytest.mark.default_compiler
def test_training_targets_and_losses(ref):
    """xt, ut and the per-example loss of every path × prediction × weighting, for the same
    (x0, t): elementwise formulas of <= 16 operations after the map's 8-term dot products."""
    model = fixed_model(ref)
    x0, x1, t = (jnp.asarray(ref[k]) for k in ("x0", "x1", "t"))
    for path in PATHS:
        plan = PATHS[path]()
        _, xt, ut = plan.plan(t, x0, x1)
        assert_within(xt, ref[f"xt/{path}"], 8, what=f"xt {path}")
        assert_within(ut, ref[f"ut/{path}"], 8, what=f"ut {path}")
        for pred in ("velocity", "score", "noise"):
            for weight in (None, "velocity", "likelihood"):
                key = f"{path}/{pred}/{weight}"
                terms = jax.jit(Transport.create(path, pred, weight).training_losses, static_argnums=0)(
                    model, x1, t, x0
                )
                assert_within(terms["pred"], ref[f"pred/{key}"], 32, what=f"pred {key}")
                # the loss sums squares of values of scale |pred| + |target|, weighted: relative bound
                expected = ref[f"loss/{key}"]
                assert_within(terms["loss"], expected, 64, scale=float(np.max(np.abs(expected))), what=key)


@pytest.mark.default_compiler
def test_coefficients_conversions_drift_score_and_diffusion(ref):
    model = fixed_model(ref)
    x1, v, t = jnp.asarray(ref["x1"]), jnp.asarray(ref["v"]), jnp.asarray(ref["t_conv"])
    te = t.reshape(-1, 1, 1, 1)
    norm = json.loads(str(ref["meta_json"]))["diffusion_norm"]
    for path in PATHS:
        plan = PATHS[path]()
        coef = [
            jnp.broadcast_to(jnp.asarray(q, jnp.float32), te.shape)
            for q in (*plan.alpha(te), *plan.sigma(te))
        ]
        coef.append(plan.d_alpha_alpha_ratio(te))
        for name, got, want in zip(("α", "α̇", "σ", "σ̇", "α̇/α"), coef, ref[f"coef/{path}"], strict=True):
            assert_within(got, want, 16, what=f"{path} {name}")
        drift_mean, drift_var = plan.drift(x1, t)
        assert_within(drift_mean, ref[f"drift_mean/{path}"], 16, what=f"{path} drift mean")
        assert_within(drift_var, ref[f"drift_var/{path}"], 16, what=f"{path} drift var")
        for name in ("score_from_velocity", "noise_from_velocity", "velocity_from_score"):
            got = getattr(plan, name)(v, x1, t)
            assert_within(got, ref[f"{name}/{path}"], 32, what=f"{path} {name}")
        for form in ("constant", "SBDM", "sigma", "linear", "decreasing", "inccreasing-decreasing"):
            got = jnp.broadcast_to(plan.diffusion(x1, t, form, norm), te.shape)
            assert_within(got, ref[f"diffusion/{path}/{form}"], 16, what=f"{path} {form}")
        for pred in ("velocity", "score", "noise"):
            tr = Transport.create(path, pred)
            assert_within(
                tr.drift(model)(x1, t), ref[f"drift/{path}/{pred}"], 64, what=f"drift {path} {pred}"
            )
            assert_within(
                tr.score(model)(x1, t), ref[f"score/{path}/{pred}"], 64, what=f"score {path} {pred}"
            )


def test_vp_path_is_dews_vp_schedule():
    """VPCPlan's σ_t/α_t is dew's VP σ(1 − t) with β_d = β_max − β_min (the rescaling stated)."""
    t = jnp.linspace(0.05, 0.999, 17)
    path = VPPath()
    direct = path.sigma(t)[0] / path.alpha(t)[0]
    np.testing.assert_allclose(path.edm_sigma(t), vp_sigma(1 - t, 19.9, 0.1), rtol=1e-6)
    np.testing.assert_allclose(
        direct, path.edm_sigma(t), rtol=64 * U / (1 - float(jnp.exp(-0.5 * 0.1 * 0.001)))
    )


def test_grid_is_torch_linspace(ref):
    """The ODE grid's float32 values are torch.linspace's (the golden's heun2 times)."""
    grid = torch_linspace(0.0, 1.0, 9)
    assert grid.dtype == np.float32 and grid[0] == 0 and grid[-1] == 1
    np.testing.assert_array_equal(np.diff(grid) > 0, True)


@pytest.mark.default_compiler
def test_ode_trajectories(ref):
    """euler and heun2 on the reference's grid; dopri5 with the reference's step-size controller:
    the same number of model evaluations (hence the same accepted/rejected steps) and states
    within 64 u per step of the trajectory's scale times its growth."""
    model, z = fixed_model(ref), jnp.asarray(ref["z"])
    meta = json.loads(str(ref["meta_json"]))
    for key in meta["ode_cases"]:
        _, path, pred, method, direction = key.split("/")
        expected = ref[key]
        sampler = TransportODE(method=method, num_steps=expected.shape[0], reverse=direction == "reverse")
        traj, stats = jax.jit(sampler.trajectory, static_argnums=(0, 1))(
            Transport.create(path, pred), model, z
        )
        if method == "dopri5":
            assert int(stats.nfe) == int(ref[f"nfe/{key}"]), key
        steps = None if stats is None else int(stats.accepted + stats.rejected)
        assert_trajectory(traj, expected, 64, steps, what=key)


@pytest.mark.default_compiler
def test_sde_trajectories_with_the_references_noise(ref):
    model, z = fixed_model(ref), jnp.asarray(ref["z"])
    meta = json.loads(str(ref["meta_json"]))
    for case in meta["sde_cases"]:
        expected = ref[case["key"]]
        sampler = TransportSDE(
            method=case["method"],
            diffusion_form=case["diffusion_form"],
            diffusion_norm=meta["sde_diffusion_norm"],
            last_step=case["last_step"],
            last_step_size=meta["sde_last_step_size"],
            num_steps=meta["sde_num_steps"],
        )
        transport = Transport.create(case["path"], case["prediction"])
        noises = jnp.asarray(ref[case["key"] + "/noises"])
        traj = jax.jit(lambda z, n, s=sampler, tr=transport: s.trajectory(tr, model, z, noises=n))(z, noises)
        assert_trajectory(traj, expected, 64, what=str(case))


def test_sample_is_the_trajectorys_last_state_without_keeping_it(ref):
    """``sample`` asks dopri5 for the last time alone and keeps no states: the same value."""
    model, z = fixed_model(ref), jnp.asarray(ref["z"])
    transport = Transport.create("GVP", "noise")
    for sampler in (TransportODE(num_steps=5), TransportODE(method="heun2", num_steps=5)):
        full = sampler.trajectory(transport, model, z)[0][-1]
        np.testing.assert_array_equal(sampler.sample(transport, model, z), full)
    sde = TransportSDE(method="Heun", num_steps=5)
    np.testing.assert_array_equal(
        sde.sample(transport, model, z, jax.random.key(0)),
        sde.trajectory(transport, model, z, jax.random.key(0))[-1],
    )


@pytest.mark.default_compiler
def test_sample_py_settings_250_points_and_250_steps(ref):
    """SiT's sample.py settings on the Linear velocity path: dopri5 reporting 250 points (atol
    1e-6, rtol 1e-3) with the reference's evaluation count, and the SDE's 250 Euler–Maruyama steps
    (sigma form, Mean last step of 0.04) with its draws."""
    model, z = fixed_model(ref), jnp.asarray(ref["z"])
    transport = Transport.create()
    traj, stats = jax.jit(TransportODE(num_steps=250).trajectory, static_argnums=(0, 1))(transport, model, z)
    assert int(stats.nfe) == int(ref["published/ode/nfe"])
    assert_trajectory(traj, ref["published/ode"], 64, int(stats.accepted + stats.rejected), what="ode 250")
    sde = TransportSDE()  # the defaults are sample.py's
    noises = jnp.asarray(ref["published/sde/noises"])
    states = jax.jit(lambda z, n: sde.trajectory(transport, model, z, noises=n))(z, noises)
    assert_trajectory(states, ref["published/sde"], 64, what="sde 250")
