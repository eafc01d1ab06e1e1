"""MeanFlow's loss, adaptive weights, target, gradient and sampler against Gsunshine/meanflow's own
``forward`` and ``generate`` (goldens: third_party/meanflow/, made by make_reference.py).

Both sides run the same small network function (``tiny_net``, written identically in
make_reference.py) on the same parameters, batch and random draws (the reference's, recorded),
so what is compared is the objective: the (t, r) mapping, guidance, class dropout, the JVP, the
target, the weighting and the solver step.

Tolerances: float32 (unit roundoff u = 2⁻²⁴) through a chain of about S = 8 stages (embedding,
two matrix products, tanh, the JVP's tangent pass, the target, the squared sum, the weight), each
accumulating over at most N = 48 terms (32 pixels + 16 hidden units): relative error
<= S · N · u ≈ 2.3e-5; compared with rtol = 2 S N u and atol = rtol · max|reference| (entries
that cancel to near zero carry the absolute error of their operands).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import pytest
from helpers_goldens import close as close_at
from helpers_goldens import load_golden, meta

from dew.objectives.meanflow_loss import Guidance, MeanFlowDraws, TimeSampling, Weighting, meanflow_loss
from dew.sampling.meanflow import sample_mean_flow

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "third_party", "meanflow", "meanflow_reference.npz")
U = 2.0**-24
RTOL = 2 * 8 * 48 * U


def tiny_net(p, x, t, h, y):
    """u(x, t, h, y) = tanh(x W1 + (sin(t a_t + b_t) + cos(h a_h + b_h) + E[y]) Wc + b1) W2 + s ⊙ x."""
    b = x.shape[0]
    xf = x.reshape(b, -1)
    emb = jnp.sin(t[:, None] * p["wt"] + p["bt"]) + jnp.cos(h[:, None] * p["wh"] + p["bh"]) + p["emb"][y]
    a = jnp.tanh(xf @ p["w1"] + emb @ p["wc"] + p["b1"])
    return (a @ p["w2"] + xf * p["skip"]).reshape(x.shape)


@pytest.fixture(scope="module")
def golden():
    return load_golden(GOLDEN)


close = functools.partial(close_at, rtol=RTOL)


def params_of(g):
    return {k[len("param_") :]: jnp.asarray(v) for k, v in g.items() if k.startswith("param_")}


CASES = ("cfg_kappa", "cfg_omega", "plain_uniform")


def settings(g, case):
    s = meta(g)["cases"][case]["settings"]
    times = TimeSampling(s["noise_dist"], s["P_mean"], s["P_std"], s["data_proportion"])
    guidance = Guidance(
        s["guidance_eq"], s["omega"], s["kappa"], s["class_dropout_prob"], s["t_start"], s["t_end"]
    )
    return times, guidance, Weighting(s["norm_p"], s["norm_eps"])


def run(g, case, params):
    times, guidance, weighting = settings(g, case)
    draws = MeanFlowDraws(
        *(jnp.asarray(g[f"{case}/{k}"]) for k in ("t_raw", "r_raw", "noise", "drop_uniform"))
    )
    num_classes = meta(g)["num_classes"]

    def u_fn(z, t, h, y):
        return tiny_net(params, z, t, h, y)

    x, y = jnp.asarray(g["x"]), jnp.asarray(g["y"])
    return meanflow_loss(u_fn, x, y, draws, times, guidance, weighting, null_label=num_classes)


@pytest.mark.default_compiler
@pytest.mark.parametrize("case", CASES)
def test_loss_target_and_weights_match_the_reference(golden, case):
    terms = jax.jit(lambda p: run(golden, case, p))(params_of(golden))
    close(terms.u_tgt, golden[f"{case}/u_tgt"])
    close(terms.weight_denominator, golden[f"{case}/adaptive_weight"].reshape(-1))
    close(terms.loss, golden[f"{case}/loss"])
    close(terms.v_loss, golden[f"{case}/v_loss"])


@pytest.mark.default_compiler
@pytest.mark.parametrize("case", CASES)
def test_gradient_matches_the_reference(golden, case):
    grads = jax.jit(jax.grad(lambda p: run(golden, case, p).loss))(params_of(golden))
    for name, g in grads.items():
        close(g, golden[f"{case}/grad_{name}"])


def test_the_goldens_exercise_guidance_interval_and_dropout(golden):
    """The cases are not degenerate: rows fall outside [t_start, t_end] and rows are dropped."""
    cases = meta(golden)["cases"]
    assert cases["cfg_kappa"]["rows_dropped"] > 0 and cases["cfg_omega"]["rows_dropped"] > 0
    times, guidance, _ = settings(golden, "cfg_kappa")
    t, r = times.times(jnp.asarray(golden["cfg_kappa/t_raw"]), jnp.asarray(golden["cfg_kappa/r_raw"]))
    outside = (t < guidance.t_start) | (t > guidance.t_end)
    assert bool(jnp.any(outside)) and bool(jnp.any(~outside)) and bool(jnp.any(t > r))


@pytest.mark.default_compiler
@pytest.mark.parametrize("steps", (1, 2))
def test_sampler_matches_generate(golden, steps):
    params = params_of(golden)
    labels = jnp.asarray(golden[f"generate{steps}/labels"])
    schedule = tuple(float(s) for s in golden[f"generate{steps}/schedule"])

    def u(z, t, h):
        return tiny_net(params, z, t, h, labels)

    out = jax.jit(lambda z: sample_mean_flow(u, z, schedule))(jnp.asarray(golden[f"generate{steps}/noise"]))
    close(out, golden[f"generate{steps}/images"])
