"""dew's DiT with MeanFlow's second time input against Gsunshine/meanflow's own flax DiT
(``models/models_dit.py``), and MeanFlow's loss, weights, gradient and sampler through dew's objective
with dew's DiT against the reference's ``forward``/``generate`` with its own network (goldens:
third_party/meanflow/meanflow_dit_reference.npz, made by make_reference.py).

The reference DiT is tiny (depth 2, width 32, 4 heads, patch 2, 8×8×2 inputs, 3 classes + null) on
random weights (the zero-initialised adaLN and final layers included); its flax parameters are
loaded into ``dew.models["dit"](time_inputs=("t", "h"), ...)`` by ``dew.interop.flax_dit``.

Tolerances: float32 (unit roundoff u = 2⁻²⁴) through S = 24 sequential stages (the sinusoidal
embeddings, two timestep MLP layers, then per block adaLN, two LayerNorms, q·k, softmax, ·v, the
projection, two MLP layers, GELU and the gated residuals; the final layer), each summing at most
N = 256 terms (the timestep MLP's fan-in): relative error <= S · N · u ≈ 3.7e-4 on the network's
output. The loss, target, weights and gradient add the JVP's tangent pass and the backward pass over
the same chain (a factor 2): rtol = 2 S N u, with atol = rtol · max|reference| (entries that cancel
to near zero carry their operands' absolute error). XLA and the reference may order sums
differently, so equality to the last bit is not expected.
"""

from __future__ import annotations

import functools
import os

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_goldens import (
    assert_gradients_match,
    class_label_spec,
    close,
    dew_params,
    load_golden,
    meta,
    use_recorded_noise,
)

from dew import registry
from dew.interop.flax_dit import check_against, module_path
from dew.objectives.meanflow import MeanFlow
from dew.objectives.meanflow_loss import Guidance, MeanFlowDraws, TimeSampling, Weighting, meanflow_loss

GOLDEN = os.path.join(
    os.path.dirname(__file__), "..", "third_party", "meanflow", "meanflow_dit_reference.npz"
)
U = 2.0**-24
NET_RTOL = 24 * 256 * U
RTOL = 2 * NET_RTOL


@pytest.fixture(scope="module")
def golden():
    return load_golden(GOLDEN)


def dit_options(g) -> dict:
    """``dew.models["dit"]`` as the reference's MeanFlow builds its DiT (``class_dropout_prob=0``
    with the null-class row, no learned variance, the ``h`` embedder)."""
    d = meta(g)["dit"]
    return dict(
        depth=d["depth"],
        hidden_size=d["hidden_size"],
        num_heads=d["num_heads"],
        patch_size=d["patch_size"],
        num_classes=d["num_classes"],
        input_size=d["input_size"],
        class_dropout_prob=0.0,
        null_class=True,
        learn_sigma=False,
        time_inputs=("t", "h"),
    )


def objective(g) -> MeanFlow:
    """dew's MeanFlow objective over dew's DiT (labels as DiT takes them: ``y`` ints, null = 3)."""
    d = meta(g)["dit"]
    spec = class_label_spec(d["input_size"], d["in_channels"])
    model = functools.partial(registry.models["dit"], **dit_options(g))
    encoder = functools.partial(registry.encoders["class_label"], d["num_classes"])
    return MeanFlow(spec, model, encoder, d["num_classes"], label_input="y")


def test_flax_names_map_to_dew_modules(golden):
    """Every reference leaf lands on a dew parameter of the same shape, and nothing is left over."""
    params = dew_params(golden)
    x = jnp.asarray(golden["net/x"])
    net = hk.transform(lambda x, t, h, y: registry.models["dit"](**dit_options(golden))(x, t, y, h=h))
    shapes = jax.eval_shape(net.init, jax.random.PRNGKey(0), x, x[:, 0, 0, 0], x[:, 0, 0, 0], golden["net/y"])
    check_against(params, shapes)
    leaf = ("blocks", "layers_1", "adaLN_modulation", "layers_1", "_flax_linear", "kernel")
    assert module_path("dit", leaf) == ("dit/blocks_1/adaLN_modulation_1", "weight")


@pytest.mark.default_compiler
def test_network_output_matches_the_reference_dit(golden):
    params = dew_params(golden)
    net = hk.transform(lambda x, t, h, y: registry.models["dit"](**dit_options(golden))(x, t, y, h=h))
    args = (jnp.asarray(golden[f"net/{k}"]) for k in ("x", "t", "h", "y"))
    out = jax.jit(net.apply)(params, None, *args)
    assert float(np.std(golden["net/out"])) > 0.5  # random weights: the adaLN and final layers act
    close(out, golden["net/out"], NET_RTOL)


CASES = ("cfg_kappa", "cfg_omega")


def run(g, case, params):
    s = meta(g)["cases"][case]["settings"]
    times = TimeSampling(s["noise_dist"], s["P_mean"], s["P_std"], s["data_proportion"])
    guidance = Guidance(
        s["guidance_eq"], s["omega"], s["kappa"], s["class_dropout_prob"], s["t_start"], s["t_end"]
    )
    draws = MeanFlowDraws(
        *(jnp.asarray(g[f"{case}/{k}"]) for k in ("t_raw", "r_raw", "noise", "drop_uniform"))
    )
    mf = objective(g)
    u = mf.average_velocity(params, None, True)
    guide = mf.average_velocity(params, None, False)
    x, y = jnp.asarray(g["net/x"]), jnp.asarray(g["labels"])
    return meanflow_loss(
        u, x, y, draws, times, guidance, Weighting(s["norm_p"], s["norm_eps"]), mf.null_label, guide_fn=guide
    )


@pytest.mark.default_compiler
@pytest.mark.parametrize("case", CASES)
def test_loss_target_and_weights_match_forward_with_the_reference_dit(golden, case):
    assert meta(golden)["cases"][case]["rows_dropped"] > 0
    terms = jax.jit(lambda p: run(golden, case, p))(dew_params(golden))
    close(terms.u_tgt, golden[f"{case}/u_tgt"], RTOL)
    close(terms.weight_denominator, golden[f"{case}/adaptive_weight"].reshape(-1), RTOL)
    close(terms.loss, golden[f"{case}/loss"], RTOL)
    close(terms.v_loss, golden[f"{case}/v_loss"], RTOL)


@pytest.mark.default_compiler
@pytest.mark.parametrize("case", CASES)
def test_gradient_matches_forward_with_the_reference_dit(golden, case):
    grads = jax.jit(jax.grad(lambda p: run(golden, case, p).loss))(dew_params(golden))
    assert_gradients_match(grads, golden, case, RTOL)


@pytest.mark.default_compiler
@pytest.mark.parametrize("steps", (1, 2))
def test_generate_matches_the_reference_with_its_dit(golden, steps, monkeypatch):
    """dew's MeanFlow sampler (the objective's ``generate``, its noise replaced by the reference's
    recorded draw) with dew's DiT against ``generate`` with the reference's DiT."""
    mf = objective(golden)
    params = dew_params(golden)
    labels = jnp.asarray(golden[f"generate{steps}/labels"])
    schedule = tuple(float(s) for s in golden[f"generate{steps}/schedule"])
    use_recorded_noise(monkeypatch, jnp.asarray(golden[f"generate{steps}/noise"]))
    out = jax.jit(lambda p: mf.generate(p, jax.random.PRNGKey(0), labels, schedule=schedule))(params)
    close(out, golden[f"generate{steps}/images"], RTOL)
