"""improved MeanFlow's network as dew's DiT options (``dew.models["imf_dit"]`` / ``iMF-*``:
``conditioning="in_context"``, ``v_head=True``) against Lyy-iiis/imeanflow's own flax ``imfDiT``
(``models/imfDiT.py``), and the ``imeanflow`` objective's loss, weights, gradient and sampler through
dew's network against the reference's ``forward``/``generate`` with its own (goldens:
third_party/imeanflow/imeanflow_dit_reference.npz, made by make_reference.py).

The reference network is tiny (depth 3 = one shared block + one block in each of the u and v heads,
width 32, 4 heads, patch 2, 8×8×2 inputs, the reference's 8/4/2+2/4 condition tokens, 3 classes +
null) on random weights (the zero-initialised gates and final layers included); its flax
parameters are loaded by ``dew.interop.flax_dit``.

Tolerances: float32 (unit roundoff u = 2⁻²⁴) through S = 24 sequential stages (the sinusoidal
embeddings and two embedder layers, then per block (two in each head's path) two RMSNorms, q/k/v,
QK-norm, the rotation, q·k, softmax, ·v, the output projection, the three SwiGLU linears and the
gated residuals; the final RMSNorm and linear), each summing at most N = 256 terms (the embedders'
fan-in): relative error <= S · N · u ≈ 3.7e-4 on (u, v). The loss, target, weights and gradient
add the JVP's tangent pass and the backward pass over the same chain (a factor 2): rtol = 2 S N u,
atol = rtol · max|reference|. XLA and the reference may order sums differently, so equality to the
last bit is not expected.
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
from dew.interop.flax_dit import check_against
from dew.objectives.imeanflow import IMeanFlow
from dew.objectives.imeanflow_loss import IMFDraws, IMFGuidance, imf_loss
from dew.objectives.meanflow_loss import TimeSampling, Weighting

GOLDEN = os.path.join(
    os.path.dirname(__file__), "..", "third_party", "imeanflow", "imeanflow_dit_reference.npz"
)
U = 2.0**-24
NET_RTOL = 24 * 256 * U
RTOL = 2 * NET_RTOL
DRAWS = ("t_raw", "r_raw", "noise", "t_min", "t_max", "omega_uniform", "drop_uniform")
CASES = ("default", "beta")
INPUTS = ("x", "t", "h", "omega", "t_min", "t_max", "y")


@pytest.fixture(scope="module")
def golden():
    return load_golden(GOLDEN)


def options(g) -> dict:
    d = meta(g)["imf_dit"]
    return dict(
        depth=d["depth"],
        hidden_size=d["hidden_size"],
        num_heads=d["num_heads"],
        head_depth=d["aux_head_depth"],
        num_classes=meta(g)["num_classes"],
        input_size=d["input_size"],
    )


def network(g):
    def forward(x, t, h, omega, t_min, t_max, y):
        net = registry.models["imf_dit"](**options(g))
        return net(x, t, y, h=h, omega=omega, t_min=t_min, t_max=t_max)

    return hk.transform(forward)


def objective(g) -> IMeanFlow:
    d = meta(g)["imf_dit"]
    spec = class_label_spec(d["input_size"], d["in_channels"])
    model = functools.partial(registry.models["imf_dit"], **options(g))
    num_classes = meta(g)["num_classes"]
    encoder = functools.partial(registry.encoders["class_label"], num_classes)
    return IMeanFlow(spec, model, encoder, num_classes, label_input="y")


def test_flax_names_map_to_dew_modules(golden):
    """Every reference leaf lands on a dew parameter of the same shape, and nothing is left over."""
    args = [jnp.asarray(golden[f"net/{k}"]) for k in INPUTS]
    shapes = jax.eval_shape(network(golden).init, jax.random.PRNGKey(0), *args)
    check_against(dew_params(golden), shapes)


def test_the_registered_sizes_are_the_references():
    """iMF-B/2 … iMF-XL/2 are imfDiT_B_2 … imfDiT_XL_2 (depth, width, heads; patch 2, aux heads 8),
    and the default DiT is not affected by the options."""
    for size, (depth, hidden, heads) in {
        "B": (12, 768, 12), "M": (24, 768, 12), "L": (32, 1024, 16), "XL": (48, 1024, 16),
    }.items():  # fmt: skip
        kw = registry.models[f"iMF-{size}/2"].keywords
        assert (kw["depth"], kw["hidden_size"], kw["num_heads"], kw["patch_size"]) == (
            depth,
            hidden,
            heads,
            2,
        )
        assert kw["head_depth"] == 8 and kw["v_head"] and kw["conditioning"] == "in_context"
        assert kw["mlp_ratio"] == 8 / 3 and kw["time_inputs"] == ("h",)


@pytest.mark.default_compiler
def test_network_outputs_match_the_reference_imfdit(golden):
    args = [jnp.asarray(golden[f"net/{k}"]) for k in INPUTS]
    u, v = jax.jit(network(golden).apply)(dew_params(golden), None, *args)
    assert min(float(np.std(golden["net/u"])), float(np.std(golden["net/v"]))) > 0.3
    close(u, golden["net/u"], NET_RTOL)
    close(v, golden["net/v"], NET_RTOL)


def run(g, case, params):
    s = meta(g)["cases"][case]["settings"]
    times = TimeSampling("logit_normal", s["P_mean"], s["P_std"], s["data_proportion"])
    guidance = IMFGuidance(s["cfg_beta"], s["class_dropout_prob"])
    weighting = Weighting(s.get("norm_p", 1.0), s.get("norm_eps", 0.01))
    draws = IMFDraws(*(jnp.asarray(g[f"{case}/{k}"]) for k in DRAWS))
    imf = objective(g)
    net = imf.imf_network(params, None, True)
    x, y = jnp.asarray(g["net/x"]), jnp.asarray(g["labels"])
    return imf_loss(net, x, y, draws, times, guidance, weighting, imf.null_label)


@pytest.mark.default_compiler
@pytest.mark.parametrize("case", CASES)
def test_loss_jvp_target_and_weights_match_forward_with_the_reference_network(golden, case):
    assert meta(golden)["cases"][case]["rows_dropped"] > 0
    terms = jax.jit(lambda p: run(golden, case, p))(dew_params(golden))
    close(terms.du_dt, golden[f"{case}/du_dt"], RTOL)
    close(terms.v_g, golden[f"{case}/v_g"], RTOL)
    close(terms.weight_u, golden[f"{case}/weight_u"].reshape(-1), RTOL)
    close(terms.weight_v, golden[f"{case}/weight_v"].reshape(-1), RTOL)
    for name in ("loss", "loss_u", "loss_v"):
        close(getattr(terms, name), golden[f"{case}/{name}"], RTOL)


@pytest.mark.default_compiler
@pytest.mark.parametrize("case", CASES)
def test_gradient_matches_forward_with_the_reference_network(golden, case):
    grads = jax.jit(jax.grad(lambda p: run(golden, case, p).loss))(dew_params(golden))
    assert_gradients_match(grads, golden, case, RTOL)


@pytest.mark.default_compiler
@pytest.mark.parametrize("steps", (1, 2))
def test_generate_matches_the_reference_with_its_network(golden, steps, monkeypatch):
    """The objective's ``generate`` (its noise replaced by the reference's recorded draw) with dew's
    network against ``generate`` with the reference's."""
    imf = objective(golden)
    labels = jnp.asarray(golden[f"generate{steps}/labels"])
    omega, t_min, t_max = (float(v) for v in golden[f"generate{steps}/guidance"])
    schedule = tuple(float(s) for s in np.linspace(1.0, 0.0, steps + 1))
    use_recorded_noise(monkeypatch, jnp.asarray(golden[f"generate{steps}/noise"]))
    out = jax.jit(
        lambda p: imf.generate(
            p, jax.random.PRNGKey(0), labels, schedule=schedule, omega=omega, t_min=t_min, t_max=t_max
        )
    )(dew_params(golden))
    close(out, golden[f"generate{steps}/images"], RTOL)


def test_the_imeanflow_objective_builds_the_registered_network_from_a_config():
    """``config.model.name="iMF-B/2"`` alone (no ``time_inputs`` in the config: the registered
    options carry ("h",)) passes ``network_factory``'s checks, and labels go in as DiT's ints."""
    from ml_collections import ConfigDict

    from dew.objectives.meanflow import label_input, network_factory

    config = ConfigDict({"model": {"name": "iMF-B/2"}})
    model = network_factory(config, "imeanflow", ("h", "omega", "t_min", "t_max"))
    assert isinstance(model, functools.partial)
    assert label_input(model) == "y" and model.keywords["time_inputs"] == ("h",)
