"""Improved MeanFlow's loss, adaptive weights, JVP, guided target, gradient and sampler against
Lyy-iiis/imeanflow's own ``forward`` and ``generate`` (goldens: third_party/imeanflow/, made by
make_reference.py).

Both sides run the same small network function with iMF's interface (``tiny_imf_net``, written
identically in make_reference.py) on the same parameters, batch and random draws (the
reference's, recorded), so what is compared is the objective: the (t, r) and ω/interval
mappings, the guided target from the v-head, class dropout, the JVP with the predicted tangent,
the compound V, both weighted losses and the solver step.

Tolerances: float32 (unit roundoff u = 2⁻²⁴) through a chain of about S = 12 stages (as MeanFlow's
eight, tests/test_meanflow_parity.py, plus the two v-head passes and the guidance combination
before the JVP and the compound V), each accumulating over at most N = 48 terms (32 pixels + 16
hidden units): rtol = 2 S N u ≈ 6.9e-5, atol = rtol · max|reference|.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_goldens import close as close_at
from helpers_goldens import load_golden, meta

from dew.objectives.imeanflow_loss import IMFDraws, IMFGuidance, imf_loss
from dew.objectives.meanflow_loss import TimeSampling, Weighting
from dew.sampling.meanflow import sample_mean_flow

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "third_party", "imeanflow", "imeanflow_reference.npz")
U = 2.0**-24
RTOL = 2 * 12 * 48 * U
DRAWS = ("t_raw", "r_raw", "noise", "t_min", "t_max", "omega_uniform", "drop_uniform")
CASES = ("default", "beta")


def tiny_imf_net(p, x, t, h, w, t_min, t_max, y):
    """a = tanh(x W1 + (sin(t a_t + b_t) + cos(h a_h + b_h) + sin((1 − 1/ω) a_w + b_w)
    + cos(t_min a_0 + b_0) + sin(t_max a_1 + b_1) + E[y]) Wc + b1);
    u = a W2u + s_u ⊙ x,  v = a W2v + s_v ⊙ x."""
    b = x.shape[0]
    xf = x.reshape(b, -1)
    emb = (
        jnp.sin(t[:, None] * p["wt"] + p["bt"])
        + jnp.cos(h[:, None] * p["wh"] + p["bh"])
        + jnp.sin((1 - 1 / w)[:, None] * p["ww"] + p["bw"])
        + jnp.cos(t_min[:, None] * p["w0"] + p["b0"])
        + jnp.sin(t_max[:, None] * p["w1t"] + p["b1t"])
        + p["emb"][y]
    )
    a = jnp.tanh(xf @ p["w1"] + emb @ p["wc"] + p["b1"])
    u = (a @ p["w2u"] + xf * p["skip_u"]).reshape(x.shape)
    v = (a @ p["w2v"] + xf * p["skip_v"]).reshape(x.shape)
    return u, v


@pytest.fixture(scope="module")
def golden():
    return load_golden(GOLDEN)


close = functools.partial(close_at, rtol=RTOL)


def params_of(g):
    return {k[len("param_") :]: jnp.asarray(v) for k, v in g.items() if k.startswith("param_")}


def settings(g, case):
    s = meta(g)["cases"][case]["settings"]
    times = TimeSampling("logit_normal", s["P_mean"], s["P_std"], s["data_proportion"])
    guidance = IMFGuidance(s["cfg_beta"], s["class_dropout_prob"])
    return times, guidance, Weighting(s.get("norm_p", 1.0), s.get("norm_eps", 0.01))


def run(g, case, params):
    times, guidance, weighting = settings(g, case)
    draws = IMFDraws(*(jnp.asarray(g[f"{case}/{k}"]) for k in DRAWS))
    num_classes = meta(g)["num_classes"]

    def imf_fn(*args):
        return tiny_imf_net(params, *args)

    x, y = jnp.asarray(g["x"]), jnp.asarray(g["y"])
    return imf_loss(imf_fn, x, y, draws, times, guidance, weighting, null_label=num_classes)


@pytest.mark.default_compiler
@pytest.mark.parametrize("case", CASES)
def test_loss_jvp_target_and_weights_match_the_reference(golden, case):
    terms = jax.jit(lambda p: run(golden, case, p))(params_of(golden))
    close(terms.du_dt, golden[f"{case}/du_dt"])
    close(terms.v_g, golden[f"{case}/v_g"])
    close(terms.weight_u, golden[f"{case}/weight_u"].reshape(-1))
    close(terms.weight_v, golden[f"{case}/weight_v"].reshape(-1))
    for name in ("loss", "loss_u", "loss_v"):
        close(getattr(terms, name), golden[f"{case}/{name}"])


@pytest.mark.default_compiler
@pytest.mark.parametrize("case", CASES)
def test_gradient_matches_the_reference(golden, case):
    grads = jax.jit(jax.grad(lambda p: run(golden, case, p).loss))(params_of(golden))
    for name, g in grads.items():
        close(g, golden[f"{case}/grad_{name}"])


def test_the_goldens_exercise_the_interval_and_dropout(golden):
    """Rows are dropped, and among the rows with r < t some lie inside their drawn guidance
    interval and some outside."""
    cases = meta(golden)["cases"]
    assert all(cases[c]["rows_dropped"] > 0 for c in CASES)
    inside = []
    for case in CASES:
        times, _, _ = settings(golden, case)
        t, _ = times.times(jnp.asarray(golden[f"{case}/t_raw"]), jnp.asarray(golden[f"{case}/r_raw"]))
        mean_flow_rows = ~np.asarray(times.flow_matching_rows(len(t)))
        t_in = (t >= golden[f"{case}/t_min"]) & (t <= golden[f"{case}/t_max"])
        inside += list(np.asarray(t_in)[mean_flow_rows])
    assert any(inside) and not all(inside)


@pytest.mark.default_compiler
@pytest.mark.parametrize("steps", (1, 2))
def test_sampler_matches_generate(golden, steps):
    params = params_of(golden)
    labels = jnp.asarray(golden[f"generate{steps}/labels"])
    omega, t_min, t_max = (float(v) for v in golden[f"generate{steps}/guidance"])
    schedule = tuple(np.linspace(1.0, 0.0, steps + 1))

    def u(z, t, h):
        full = jnp.full_like(t, 1.0)
        return tiny_imf_net(params, z, t, h, omega * full, t_min * full, t_max * full, labels)[0]

    out = jax.jit(lambda z: sample_mean_flow(u, z, schedule))(jnp.asarray(golden[f"generate{steps}/noise"]))
    close(out, golden[f"generate{steps}/images"])
