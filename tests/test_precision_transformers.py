"""bfloat16 for the transformer and one-step objectives (``config.precision.compute``): DiT's
``iddpm``, SiT's ``interpolant``, REPA's (the interpolant with its projector), ``meanflow`` (its
JVP through the network in bfloat16), ``imeanflow`` and ``edm2`` (its U-Net's activations in
bfloat16 on float32 weights normalised at use). The float32 policy is each objective's
program unchanged; bfloat16 agrees with float32 within a bound derived from bf16's unit roundoff.

The bound
---------
u = 2^-8 (bfloat16 keeps 8 significand bits). Each operation that produces a bfloat16 value
rounds it once, with a relative error |δ| ≤ u; the test counts them in the forward program
itself: n_f = the equations of the bfloat16 loss's jaxpr whose output is bfloat16 (every
operation of the network, not only those on the longest path, so n_f over-counts the path the
error travels). Layer norms re-normalise every block, so to first order the relative error is
the sum of the δ's on the path; modelled as independent and uniform on [−u, u] (variance u²/3)
the sum has standard deviation √(n_f/3)·u. As ``tests/system/test_precision.py`` does for EDM's
U-Net, the loss may differ by twice that, and the gradient (reverse mode rounds as many
cotangents again: n = 2 n_f) by 2·√(2 n_f/3)·u, norm-wise. Dots accumulate in float32 on the CPU
(XLA), as on the TPU's MXU. What the bound excludes is a policy that loses more than rounding
(a cast that drops a dtype's range, a JVP tangent dropped to zero); that times reach the
network in float32 (t = 999 is 1000 in bfloat16) is
``test_times_and_labels_reach_the_network_as_given``. The network must also really compute in
bfloat16: the error exceeds float32's, and the program holds bf16 values. Measured on the
digits configs (n_f 199 to 4,750): errors 30 to 10⁶ times inside the bound; with the policy
removed (the network in float32) the last check fails.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import ROOT
from test_repa import encoder_file  # noqa: F401 - REPA's frozen encoder: random weights, as a fixture

from dew.config import load_config
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer_config import resolve_config

U = 2.0**-8
SMALL = {"model.depth": 2, "model.hidden_size": 32, "model.num_heads": 2, "dataset.batch_size": 8}
RUNS = {
    "iddpm (DiT)": ("dit.py:digits", SMALL),
    "interpolant (SiT)": ("sit.py:digits", SMALL),
    "interpolant + REPA": (
        "repa.py:digits",
        {**SMALL, "objective.repa.encoder_depth": 1, "objective.repa.projector_dim": 16},
    ),
    "meanflow": ("meanflow.py:digits", {"dataset.batch_size": 8}),
    "imeanflow (iMF DiT)": ("meanflow.py:iMF-digits", {"dataset.batch_size": 8}),
    "edm2 (its magnitude-preserving U-Net)": ("edm2.py:digits", {"dataset.batch_size": 8}),
}


def objective_for(run: str, compute: str, encoder: str = ""):
    spec, overrides = RUNS[run]
    if "objective.repa.encoder_depth" in overrides:
        overrides = {**overrides, "objective.repa.encoder_weights": encoder}
    config = load_config(str(ROOT / "experiments" / spec))
    settings = [
        f"config.{k}={v}" if isinstance(v, str) else f"config.{k}={v!r}"
        for k, v in {**overrides, "precision.compute": compute}.items()
    ]
    c = resolve_config(config, settings)
    return build_objective(c, open_split(c.dataset, "train")), c


def batch_for(objective, c) -> dict:
    """A seeded batch of the source's own rows (their fields, shapes and dtypes)."""
    source = open_split(c.dataset, "train")
    rows = np.random.default_rng(0).choice(len(source), c.dataset.batch_size, replace=False)
    return {name: np.asarray(column[np.sort(rows)]) for name, column in source.fields.items()}


def perturbed(params):
    """Every weight moved by N(0, 0.05²): zero-initialised gates and output layers would leave
    the network out of the loss."""
    rng = np.random.default_rng(1)
    return jax.tree.map(lambda p: p + 0.05 * jnp.asarray(rng.normal(size=p.shape), p.dtype), params)


def loss_and_gradient(objective, params, batch):
    def fn(p):
        return jax.value_and_grad(objective.loss, has_aux=True)(
            p, jax.random.PRNGKey(1), batch, Step(index=jnp.int32(0))
        )

    (loss, _), grads = jax.jit(fn)(params)
    return float(loss), grads


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def bf16_roundings(objective, params, batch) -> int:
    """n_f: the equations of the loss's program (nested ones included) that produce bfloat16."""
    closed = jax.make_jaxpr(lambda p: objective.loss(p, jax.random.PRNGKey(1), batch, Step(jnp.int32(0))))(
        params
    )

    def count(jaxpr) -> int:
        total = 0
        for eqn in jaxpr.eqns:
            total += sum(getattr(v.aval, "dtype", None) == jnp.bfloat16 for v in eqn.outvars)
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    total += count(inner)
                elif hasattr(value, "eqns"):
                    total += count(value)
        return total

    return count(closed.jaxpr)


def roundoff_errors(reference, low, c32) -> tuple[int, float, float]:
    """(n_f, the loss's relative error, the gradient's norm-wise relative error) of the bfloat16
    objective ``low`` against the float32 ``reference`` (config ``c32``) on a seeded batch at
    perturbed parameters; checks that parameters and gradients are float32 under both, that the
    bfloat16 program holds bfloat16 values and that its loss and gradients are finite."""
    assert "bfloat16" in type(low).precisions
    batch = batch_for(reference, c32)
    params = perturbed(reference.init(jax.random.PRNGKey(0), batch))
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    loss32, grads32 = loss_and_gradient(reference, params, batch)
    loss16, grads16 = loss_and_gradient(low, params, batch)
    assert {x.dtype for x in jax.tree.leaves(grads16)} == {jnp.dtype(jnp.float32)}
    n_f = bf16_roundings(low, params, batch)
    assert n_f > 0, "the bfloat16 program computes nothing in bfloat16"
    g32, g16 = flat(grads32), flat(grads16)
    assert np.all(np.isfinite(g16)) and math.isfinite(loss16)
    return n_f, abs(loss16 - loss32) / abs(loss32), float(np.linalg.norm(g16 - g32) / np.linalg.norm(g32))


@pytest.mark.parametrize("run", list(RUNS))
def test_bfloat16_loss_and_gradients_agree_with_float32_within_the_roundoff_bound(run, request):
    encoder = request.getfixturevalue("encoder_file")  # test_repa's: REPA's frozen encoder
    reference, c32 = objective_for(run, "float32", encoder)
    low, _ = objective_for(run, "bfloat16", encoder)
    n_f, loss_error, gradient_error = roundoff_errors(reference, low, c32)
    loss_bound = 2 * math.sqrt(n_f / 3) * U
    gradient_bound = 2 * math.sqrt(2 * n_f / 3) * U
    assert loss_error <= loss_bound, (n_f, loss_error, loss_bound)
    assert gradient_error <= gradient_bound, (n_f, gradient_error, gradient_bound)
    assert gradient_error > 2.0**-20, "bfloat16 gave float32's gradients: the network ran in float32"


@pytest.mark.parametrize("run", ["iddpm (DiT)", "meanflow"])
def test_the_float32_policy_adds_no_operation(run):
    objective, c = objective_for(run, "float32")
    batch = batch_for(objective, c)
    params = jax.eval_shape(objective.init, jax.random.PRNGKey(0), batch)
    program = str(
        jax.make_jaxpr(lambda p: objective.loss(p, jax.random.PRNGKey(1), batch, Step(jnp.int32(0))))(params)
    )
    assert "bf16" not in program


def test_times_and_labels_reach_the_network_as_given():
    """``compute_in`` casts the parameters and the input x, and nothing else: t = 999 stays 999
    (bfloat16 would make it 1000), labels stay int32, and the output returns to float32."""
    from dew.training.precision import compute_in

    def apply(params, rng, x, t, y):
        return {"x": x, "w": params["w"], "t": t, "y": y, "out": x * params["w"]}

    mixed = compute_in(apply, "bfloat16")
    t = jnp.asarray([999.0, 0.5], jnp.float32)
    got = mixed({"w": jnp.ones(()), "n": jnp.int32(3)}, None, jnp.ones((2,)), t, jnp.asarray([1, 2]))
    assert got["t"].dtype == jnp.float32 and np.array_equal(np.asarray(got["t"]), [999.0, 0.5])
    assert got["y"].dtype == jnp.int32
    assert got["out"].dtype == jnp.float32 and got["x"].dtype == jnp.float32
    assert compute_in(apply, "float32") is apply
