"""EDM2's network (dew.networks.edm2_*) against NVlabs/edm2's own ``Precond``.

Goldens: ``third_party/edm2/network_reference.npz`` (outputs on random weights, train and eval
mode) and ``param_counts.json`` (every ``train_edm2.py`` preset's parameter names, shapes and
counts), both made by the reference's code (scripts beside them).
"""

from __future__ import annotations

import functools
import json
import os

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import registry
from dew.networks import edm2_weights
from dew.networks.edm2_layers import BUFFER_NAMES, project_weights
from dew.networks.edm2_precond import EDM2Precond

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

HERE = os.path.dirname(os.path.abspath(__file__))
THIRD_PARTY = os.path.join(HERE, "..", "third_party", "edm2")
UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2


def _reference():
    return np.load(os.path.join(THIRD_PARTY, "network_reference.npz"))


def _transformed(config: dict) -> hk.Transformed:
    kwargs = {k: v for k, v in config.items() if k not in ("img_resolution", "img_channels")}

    def forward(x, sigma, label, is_training):
        return EDM2Precond(**kwargs)(x, sigma, label=label, is_training=is_training, return_logvar=True)

    return hk.transform(forward)


def _shapes(tree) -> dict:
    return {m: {k: tuple(v.shape) for k, v in leaves.items()} for m, leaves in tree.items()}


@functools.cache
def _converted():
    ref = _reference()
    config = json.loads(str(ref["config_json"]))
    net = _transformed(config)
    x = jnp.asarray(ref["x"].transpose(0, 2, 3, 1))
    sigma, labels = jnp.asarray(ref["sigma"]), jnp.asarray(ref["class_labels"])
    abstract = jax.eval_shape(
        functools.partial(net.init, is_training=True), jax.random.key(0), x, sigma, labels
    )
    state = {k[len("param/") :]: ref[k] for k in ref.files if k.startswith("param/")}
    params = edm2_weights.convert_state_dict(state)
    edm2_weights.check_against(params, _shapes(abstract))  # names and shapes map one to one
    return net, jax.tree.map(jnp.asarray, params), (x, sigma, labels)


def test_registered_under_the_model_registry():
    assert registry.models["edm2"] is EDM2Precond
    assert registry.models["edm2unet"].__name__ == "EDM2UNet"


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_outputs_match_the_reference(mode):
    """D(x; σ) and u(σ) equal the reference's. Train mode is the reference's training forward,
    which first overwrites the stored weights with normalize(w): in dew, ``project_weights``
    then the (pure) forward. Dropout is 0, so train and eval differ only by that projection.

    Bound: every MPConv output is a length-n dot product of unit-magnitude factors, whose float32
    rounding error is at most γ_n ≈ n·u relative (Higham, Thm 3.5); the layers preserve magnitude,
    so first-order errors add along the network: u · Σ_layers n_l, times max|D| (≥ 1)."""
    ref = _reference()
    net, params, (x, sigma, labels) = _converted()
    if mode == "train":
        params = project_weights(params, lambda module: True)
    denoised, logvar = jax.jit(net.apply, static_argnums=5)(params, None, x, sigma, labels, False)
    fan_ins = sum(int(np.prod(v.shape[:-1])) for m in params.values() for k, v in m.items() if k == "weight")
    want_d = ref[f"{mode}/denoised"].transpose(0, 2, 3, 1)
    bound = UNIT_ROUNDOFF * fan_ins * max(1.0, float(np.abs(want_d).max()))
    np.testing.assert_allclose(np.asarray(denoised), want_d, atol=bound, rtol=0)
    np.testing.assert_allclose(np.asarray(logvar), ref[f"{mode}/logvar"], atol=bound, rtol=0)


def test_forced_weight_normalisation_matches_the_reference():
    """``project_weights`` writes what the reference's training forward writes into its weights
    (normalize(w) per output channel: a length-n norm, error ≤ n·u relative, n = fan-in)."""
    ref = _reference()
    _, params, _ = _converted()
    projected = project_weights(params, lambda module: True)
    checked = 0
    for key in ref.files:
        if not key.startswith("train_weight/"):
            continue
        module, name = edm2_weights.dew_name(key[len("train_weight/") :])
        want = edm2_weights.to_dew_layout(ref[key])
        fan_in = int(np.prod(want.shape[:-1]))
        got = np.asarray(projected[module][name])
        np.testing.assert_allclose(got, want, atol=fan_in * UNIT_ROUNDOFF * np.abs(want).max(), rtol=0)
        checked += 1
    assert checked >= 20


def _preset_counts():
    with open(os.path.join(THIRD_PARTY, "param_counts.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("preset", sorted(_preset_counts()))
def test_parameter_names_shapes_and_counts_equal_the_reference(preset):
    """Every state_dict entry of the reference's preset network maps to a dew parameter of the
    same shape (dew layout) and none is left over; the counts (parameters, buffers) agree.
    Shapes only (jax.eval_shape): nothing is allocated."""
    entry = _preset_counts()[preset]
    interface, kwargs = entry["interface"], entry["network_kwargs"]
    res, channels = interface["img_resolution"], interface["img_channels"]
    net = _transformed({"label_dim": interface["label_dim"], **kwargs})
    x = jax.ShapeDtypeStruct((1, res, res, channels), jnp.float32)
    sigma = jax.ShapeDtypeStruct((1,), jnp.float32)
    labels = jax.ShapeDtypeStruct((1, interface["label_dim"]), jnp.float32)
    abstract = jax.eval_shape(
        functools.partial(net.init, is_training=True), jax.random.key(0), x, sigma, labels
    )
    expected = {}
    for key, shape in entry["shapes"].items():
        module, name = edm2_weights.dew_name(key)
        expected.setdefault(module, {})[name] = tuple(
            edm2_weights.to_dew_layout(np.empty(shape, np.bool_)).shape
        )
    dew_shapes = _shapes(abstract)
    fake = {m: {k: np.empty(s, np.bool_) for k, s in leaves.items()} for m, leaves in dew_shapes.items()}
    edm2_weights.check_against(fake, expected)
    counts = {"parameters": 0, "buffers": 0}
    for leaves in dew_shapes.values():
        for name, shape in leaves.items():
            counts["buffers" if name in BUFFER_NAMES else "parameters"] += int(np.prod(shape))
    assert counts == {"parameters": entry["num_parameters"], "buffers": entry["num_buffers"]}, preset
