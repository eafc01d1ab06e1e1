"""dew's REPA samplers (``dew.sampling.repa_sampler``) against sihyun-yu/REPA's own
``samplers.py`` (third_party/repa/samplers.npz, made by make_samplers.py): ``euler_sampler``
(Euler and Heun) and ``euler_maruyama_sampler`` on both paths, with and without guidance inside
an interval (one case has t = 0.7 on the grid, the interval's edge), and the published FID's
250-step SDE, with the reference's noise draws injected.

The network is the golden's fixed map in REPA's convention (NCHW, t = 1 at the noise,
velocity v = dx/dt), handed to dew's sampler as dew's interpolant networks are: NHWC, SiT time
s = 1 − t, v_S = −v; guided as the ``interpolant`` objective's ``guided_network`` guides (the
doubled batch, all channels, the interval in SiT time [1 − high, 1 − low]).

Bounds (``assert_trajectory`` of tests/test_interpolants_parity.py): float32 unit roundoff
u = 2⁻²⁴ times 64 operations per step (the map's 64-term dot products, the drift's and CFG's
elementwise terms; REPA's float64 state against dew's float32 one is one rounding per step),
times the steps so far, times the trajectory's growth (max |x| over its start: e^{∫L} for this
linear field), relative to the states' scale.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_interpolants_parity import assert_trajectory

from dew.diffusion.transport import Transport
from dew.sampling.repa_sampler import RepaSampler
from dew.sampling.transport_ode import torch_linspace
from dew.schema import ConfigError

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "repa" / "samplers.npz"
NULL = 1000  # REPA's null class
U = 2.0**-24  # float32 unit roundoff
TRANSPORT = {"linear": Transport.create("Linear"), "cosine": Transport.create("GVP")}


@pytest.fixture(scope="module")
def ref():
    with np.load(GOLDEN, allow_pickle=False) as data:
        return dict(data)


def nhwc(a):
    return np.moveaxis(np.asarray(a), -3, -1)


def repa_map(ref):
    """make_samplers.py's fixed map, REPA's convention: NCHW x, t = 1 at the noise."""
    W, c = jnp.asarray(ref["W"]), jnp.asarray(ref["c"])
    freqs = 0.37 * jnp.arange(1, 5, dtype=jnp.float32)

    def model(x, t, y):
        b = x.shape[0]
        t4 = t.reshape(b, 1, 1, 1)
        emb = 0.5 * jnp.sin((y.astype(jnp.float32)[:, None] + 1.0) * freqs[None])
        return (x.reshape(b, -1) @ W).reshape(x.shape) * (1 + 0.5 * t4) + t4 * c + emb[:, :, None, None]

    return model


def dew_network(ref, case):
    """The map as dew's sampler sees a network: NHWC, SiT time s, −v; for cfg_scale > 1 on the
    doubled batch, guided on every channel for s (or ``guide_time``) in [1 − high, 1 − low]."""
    repa = repa_map(ref)
    y = jnp.asarray(ref["y"])
    null = jnp.full(y.shape, NULL, y.dtype)

    def plain(x, s, labels):
        return -jnp.moveaxis(repa(jnp.moveaxis(x, -1, 1), 1.0 - s, labels), 1, -1)

    scale, lo, hi = case["cfg_scale"], 1.0 - case["guidance_high"], 1.0 - case["guidance_low"]
    if scale == 1.0:
        return lambda x, s, guide_time=None: plain(x, s, y)

    def guided(x, s, guide_time=None):
        n = x.shape[0] // 2
        now = (s if guide_time is None else guide_time)[0]
        cond, uncond = plain(x[:n], s[:n], y), plain(x[:n], s[:n], null)
        g = uncond + scale * (cond - uncond)
        outside = jnp.concatenate([cond, plain(x[n:], s[n:], null)])
        return jnp.where((now >= lo) & (now <= hi), jnp.concatenate([g, g]), outside)

    return guided


def run(ref, case, **overrides):
    sampler = RepaSampler(
        mode=case["mode"], num_steps=case["num_steps"], heun=case["heun"] and case["mode"] == "ode"
    )
    sampler = RepaSampler(**{**sampler.__dict__, **overrides}) if overrides else sampler
    z = jnp.asarray(nhwc(ref["z"]))
    doubled = case["cfg_scale"] > 1.0
    x = jnp.concatenate([z, z]) if doubled else z
    noises = None
    if case["mode"] == "sde":
        eps = nhwc(ref[case["name"] + "/noises"]).astype(np.float32)
        noises = jnp.asarray(np.concatenate([eps, eps], axis=1) if doubled else eps)
    model = dew_network(ref, case)
    traj = jax.jit(lambda x, n: sampler.trajectory(TRANSPORT[case["path_type"]], model, x, noises=n))(
        x, noises
    )
    return np.asarray(traj[:, : z.shape[0]], np.float64)


def cases(ref):
    return json.loads(str(ref["meta_json"]))["cases"]


def test_the_grids_are_the_references(ref):
    np.testing.assert_array_equal(RepaSampler(mode="ode", num_steps=50).grid(), ref["ode_grid_50"])
    np.testing.assert_array_equal(RepaSampler().grid(), ref["sde_grid_250"])
    np.testing.assert_array_equal(torch_linspace(1.0, 0.0, 51, np.float64), ref["ode_grid_50"])


@pytest.mark.default_compiler
def test_trajectories_match_repa_samplers_py(ref):
    """Every case: the state before each step is what the reference fed its network (its
    Euler/SDE steps; Heun's first evaluations), the last row its output."""
    for case in cases(ref):
        name = case["name"]
        traj = run(ref, case)
        call_x = nhwc(ref[name + "/call_x"]).astype(np.float64)
        starts = call_x[::2] if case["heun"] and case["mode"] == "ode" else call_x
        expected = np.concatenate([starts, nhwc(ref[name + "/out"])[None]])  # x_0 ... x_N
        actual = np.concatenate([starts[:1], traj])
        assert_trajectory(actual, expected, 64, what=name)


@pytest.mark.default_compiler
def test_guidance_follows_the_references_interval(ref):
    """Where the reference guided (its network saw the doubled batch) the guided run departs from
    the unguided one from that step on, and not before (the interval edge t = 0.7 included):
    before, the two differ only by the roundoff of the same arithmetic on batches of two sizes
    (64 u per step of the states' scale), at that step by a hundred times more."""
    for case in cases(ref):
        if case["cfg_scale"] == 1.0:
            continue
        guided = np.asarray(ref[case["name"] + "/call_guided"])
        if case["heun"] and case["mode"] == "ode":
            guided = guided[::2]
        first = int(np.argmax(guided))
        with_cfg = run(ref, case)
        without = run(ref, {**case, "cfg_scale": 1.0})
        diff = np.max(np.abs(with_cfg - without).reshape(len(with_cfg), -1), axis=1)
        scale = max(float(np.max(np.abs(without))), 1.0)
        before = float(np.max(diff[:first], initial=0.0))
        assert before <= 64 * U * scale * first, (case["name"], before)
        assert diff[first] > 100 * max(before, U * scale), (case["name"], diff[first], before)


def test_the_published_settings_are_registered():
    import dew

    sde = dew.samplers["repa_sde"]
    assert (sde.mode, sde.num_steps, sde.heun) == ("sde", 250, False)
    assert dew.samplers["repa_ode"] == RepaSampler(mode="ode", num_steps=50)
    assert dew.samplers["repa_ode_heun"].heun


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RepaSampler(mode="dopri5"), "mode='dopri5' is unknown"),
        (lambda: RepaSampler(num_steps=1), "num_steps=1 is invalid"),
        (lambda: RepaSampler(heun=True), "heun=True is invalid for REPA's sde mode"),
        (
            lambda: RepaSampler().sample(
                Transport.create("VP"), lambda x, t: x, jnp.zeros((1, 2)), jax.random.key(0)
            ),
            "config.objective.path='VP' has no REPA sampler",
        ),
    ],
)
def test_bad_settings_get_one_line(build, message):
    with pytest.raises(ConfigError, match=message) as info:
        build()
    assert "\n" not in str(info.value)


def test_the_sde_draws_from_rng_reproducibly():
    model = lambda x, t: -x  # noqa: E731
    sampler = RepaSampler(num_steps=5)
    z = jax.random.normal(jax.random.key(0), (3, 2))
    a, b = (sampler.sample(Transport.create(), model, z, jax.random.key(1)) for _ in range(2))
    c = sampler.sample(Transport.create(), model, z, jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    with pytest.raises(ValueError, match="needs rng="):
        sampler.sample(Transport.create(), model, z)


def test_a_repa_sampler_on_a_path_it_has_no_rule_for_is_a_config_error():
    from helpers_common import ROOT

    from dew.config import apply_overrides, load_config
    from dew.training.trainer_config import resolve_config

    config = load_config(f"{ROOT / 'experiments' / 'repa.py'}:digits-baseline")
    texts = ["config.objective.sampling.sampler=repa_sde", "config.objective.path=VP"]
    with pytest.raises(ConfigError, match=r"config\.objective\.path='VP' has no REPA sampler") as info:
        resolve_config(apply_overrides(config, texts))
    assert "\n" not in str(info.value)
    resolve_config(apply_overrides(config, [texts[0], "config.objective.path=GVP"]))  # REPA's cosine
