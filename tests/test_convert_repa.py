"""A sihyun-yu/REPA checkpoint in dew: ``dew.convert_dit --source=repa`` and the DiT/SiT option
``time_direction="repa"`` (``dew.networks.dit``), against REPA's own code
(third_party/repa/make_checkpoint.py: a tiny random-weight ``models/sit.py`` ``SiT`` saved as
``train.py`` saves, its raw outputs, and ``samplers.py``'s ``euler_sampler`` /
``euler_maruyama_sampler`` on it with fixed noise).

REPA trains t = 1 at the noise (x_t = (1 − t)·x + t·ε, target ε − x); dew's objective and
samplers run SiT's time s (0 at the noise, velocity x − ε). The option makes the converted
network net(x, s) = −REPA(x, 1 − s), so (1) it equals the negated reference output at the
mirrored points, (2) dew's ``repa_ode``/``repa_sde`` (which call the network at s = 1 − t and
negate it back) reproduce REPA's samplers, and (3) the interpolant loss trains the weights toward
REPA's own target at REPA's time.

Bounds. One network evaluation: tests/test_dit.py's ``BOUND_FACTOR`` u·max|out| (λ · products ·
√K); feeding 1 − s instead of t moves t by at most u (the float32 rounding of 1 − t), which the
time embedding's frequencies (≤ 1) carry as ≤ u into the embedding, far inside that bound. The
samplers: per step, the guided velocity's error (1 + 2·cfg) network errors, doubled by the
SDE's drift d = (2 − t)·v + x (linear path), over 8 steps of the states' scale, times the
trajectory's growth (max |x| over its start), as tests/test_repa_sampler.py bounds trajectories.
"""

from __future__ import annotations

import functools
import json

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import ROOT
from ml_collections import ConfigDict
from test_interpolants_parity import growth

from dew import convert_dit, registry
from dew.diffusion.transport import Transport
from dew.inputs import Condition, Field, InputSpec
from dew.interop import dit_checkpoint
from dew.networks.dit import check_options
from dew.objectives.interpolant import Guidance, Interpolant
from dew.sampling.repa_sampler import RepaSampler
from dew.schema import ConfigError

REPA = ROOT / "third_party" / "repa"
CHECKPOINT = REPA / "repa_tiny_checkpoint.pt"
U = 2.0**-24
BOUND_FACTOR = 4 * 12 * 16  # tests/test_dit.py's: λ · products · √K
NULL = 1000


@pytest.fixture(scope="module")
def ref():
    with np.load(REPA / "repa_tiny_outputs.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def options(ref, direction: str = "repa") -> dict:
    c = json.loads(str(ref["meta_json"]))["config"]
    return {
        "depth": c["depth"],
        "hidden_size": c["hidden_size"],
        "num_heads": c["num_heads"],
        "patch_size": c["patch_size"],
        "num_classes": c["num_classes"],
        "class_dropout_prob": c["class_dropout_prob"],
        "input_size": c["input_size"],
        "learn_sigma": False,  # REPA's SiT: out_channels = in_channels
        "encoder_depth": c["encoder_depth"],
        "projector_dims": tuple(c["z_dims"]),
        "projector_hidden": c["projector_dim"],
        "time_direction": direction,
    }


def nhwc(a) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(np.asarray(a), 1, -1))


@pytest.fixture(scope="module")
def params(ref):
    state = dit_checkpoint.read_checkpoint(CHECKPOINT, "ema")  # train.py's dict, no PyTorch
    converted = dit_checkpoint.convert(state, "sit", options(ref))
    return jax.tree.map(jnp.asarray, converted)


def apply(opts, params, x, t, y, **kwargs):
    def f(x, t, y):
        return registry.models["sit"](**opts)(x, t, y, **kwargs)

    return hk.transform(f).apply(params, None, x, t, y)


def bound(reference) -> float:
    return BOUND_FACTOR * U * float(np.max(np.abs(reference)))


@pytest.mark.default_compiler
def test_the_option_is_repas_network_in_sits_time(ref, params):
    """net(x, s) = −REPA(x, 1 − s) and the projector tokens are REPA's at its t; without the
    option the same weights are REPA's network as it is (t = 1 at the noise, +v)."""
    x, t, y = jnp.asarray(nhwc(ref["x"])), jnp.asarray(ref["t"]), jnp.asarray(ref["y"], jnp.int32)
    s = 1.0 - t
    out, (z,) = apply(options(ref), params, x, s, y, return_features=True)
    expected = -nhwc(ref["out"])
    np.testing.assert_allclose(out, expected, atol=bound(expected), rtol=0)
    np.testing.assert_allclose(z, ref["z0"], atol=bound(ref["z0"]), rtol=0)
    plain = apply(options(ref, "sit"), params, x, t, y)
    np.testing.assert_allclose(plain, nhwc(ref["out"]), atol=bound(expected), rtol=0)
    assert float(np.max(np.abs(expected))) > 1.0  # the comparison is not of zeros


def objective(ref, path: str = "Linear") -> Interpolant:
    c = json.loads(str(ref["meta_json"]))["config"]
    size, channels = c["input_size"], c["in_channels"]
    spec = InputSpec(
        Field("image", (size, size, channels)),
        {"label": Condition("class_label", Field("label", (), "int32"), c["num_classes"])},
    )
    model = functools.partial(registry.models["sit"], **options(ref))
    return Interpolant(spec, Transport.create(path), model, num_classes=c["num_classes"])


@pytest.mark.default_compiler
@pytest.mark.parametrize("mode", ["ode", "sde"])
def test_repa_samplers_on_the_converted_network_reproduce_repas(ref, params, mode):
    """dew's ``repa_ode``/``repa_sde`` (8 steps) through the interpolant objective's guided
    network (REPA's cfg on every channel for its t in [low, high] = s in [1 − high, 1 − low])
    give what REPA's ``samplers.py`` gave on the reference network with the same noise."""
    meta = json.loads(str(ref["meta_json"]))
    scale, low, high = meta["cfg_scale"], meta["guidance_low"], meta["guidance_high"]
    obj = objective(ref)
    labels = jnp.asarray(ref["labels"], jnp.int32)
    guidance = Guidance(scale, int(ref["z"].shape[1]), (1.0 - high, 1.0 - low))
    model = obj.guided_network(params, labels, guidance)
    z = jnp.asarray(nhwc(ref["z"]))
    noises = None
    if mode == "sde":
        eps = np.moveaxis(ref["sde/noises"], 2, -1).astype(np.float32)  # [steps − 1, B, H, W, C]
        noises = jnp.asarray(np.concatenate([eps, eps], axis=1))  # the doubled batch's rows
    sampler = RepaSampler(mode=mode, num_steps=meta["steps"])
    traj = sampler.trajectory(obj.transport, model, jnp.concatenate([z, z]), noises=noises)
    traj = np.asarray(traj[:, : z.shape[0]], np.float64)
    expected = nhwc(ref[f"{mode}/out"])
    path = np.concatenate([np.asarray(z, np.float64)[None], traj])
    states = max(float(np.max(np.abs(path))), 1.0)
    ops = 2 * (1 + 2 * scale) * BOUND_FACTOR * meta["steps"]
    err = float(np.max(np.abs(traj[-1] - expected)))
    assert err <= ops * U * states * growth(path), (mode, err, ops * U * states * growth(path))


@pytest.mark.default_compiler
@pytest.mark.parametrize("path", ["Linear", "GVP"])
def test_the_interpolant_loss_trains_toward_repas_target_in_repas_time(ref, params, path):
    """SiT's loss ‖net(x_s, s) − u_s‖² with the option (x_s = α_s x + σ_s ε, s = 1 − t) is REPA's
    ``SILoss`` denoising term ‖REPA(x_t, t) − (α̇_t x + σ̇_t ε)‖² on the same weights (linear:
    α = 1 − t, σ = t; cosine: α = cos(πt/2), σ = sin(πt/2))."""
    obj = objective(ref, path)
    x = jnp.asarray(nhwc(ref["x"]))
    eps = jax.random.normal(jax.random.key(3), x.shape)
    y = jnp.asarray(ref["y"], jnp.int32)
    s = jnp.asarray([0.1, 0.45, 0.8])
    net = obj.network(params, y)
    dew_loss = obj.transport.training_losses(net, x, s, eps)["loss"]

    t = (1.0 - s)[:, None, None, None]
    if path == "Linear":
        alpha, sigma, d_alpha, d_sigma = 1 - t, t, -jnp.ones_like(t), jnp.ones_like(t)
    else:
        alpha, sigma = jnp.cos(t * jnp.pi / 2), jnp.sin(t * jnp.pi / 2)
        d_alpha, d_sigma = -jnp.pi / 2 * sigma, jnp.pi / 2 * alpha
    x_t = alpha * x + sigma * eps
    v = apply(options(ref, "sit"), params, x_t, 1.0 - s, y)  # REPA's network as it is, at its t
    residual = v - (d_alpha * x + d_sigma * eps)
    repa_loss = jnp.mean(residual**2, axis=(1, 2, 3))
    # |Δloss| ≤ 2·max|r|·Δr, Δr one network evaluation (plus the inputs' few-u roundoff)
    tol = 2 * float(jnp.max(jnp.abs(residual))) * (bound(v) + 8 * U * float(jnp.max(jnp.abs(x_t))))
    np.testing.assert_allclose(dew_loss, repa_loss, atol=tol, rtol=0)
    assert float(jnp.min(repa_loss)) > 100 * tol  # not a comparison of zeros


def test_bad_options_are_one_line():
    for opts, message in [
        ({"time_direction": "backwards"}, "time_direction='backwards' is invalid"),
        ({"time_direction": "repa", "returns_variance": True}, "REPA has no variance"),  # DiT's 2C
        ({"time_direction": "repa", "time_inputs": ("t", "h")}, "unless the network reads t alone"),
    ]:
        with pytest.raises(ConfigError, match=message) as info:
            check_options(depth=1, hidden_size=32, num_heads=2, patch_size=2, **opts)
        assert "\n" not in str(info.value)


def test_a_repa_checkpoint_needs_its_source_and_a_matching_network(ref, tmp_path, capsys):
    state = dit_checkpoint.read_checkpoint(CHECKPOINT)
    config = ConfigDict(
        {"model": {"name": "SiT-XL/2"}, "objective": {"name": "interpolant", "path": "Linear"}}
    )
    with pytest.raises(convert_dit.ConversionError, match="pass --source=repa"):
        convert_dit.with_time_direction(config, state, None)
    assert convert_dit.with_time_direction(config, state, "sit") is config
    converted = convert_dit.with_time_direction(config, state, "repa")
    assert converted.model.time_direction == "repa" and "time_direction" not in config.model
    for change, message in [
        ({"objective": {"name": "interpolant", "path": "VP"}}, "is not REPA's"),
        ({"objective": {"name": "edm"}}, "is not REPA's"),
    ]:
        with pytest.raises(convert_dit.ConversionError, match=message):
            convert_dit.with_time_direction(ConfigDict({**config.to_dict(), **change}), state, "repa")
    # A REPA checkpoint of another size: the key, its shape and the network's, one line.
    with pytest.raises(dit_checkpoint.CheckpointError, match=r"blocks\.1\.") as info:
        dit_checkpoint.convert(state, "sit", {**options(ref), "depth": 1})
    assert "\n" not in str(info.value)
    # The command: one line, exit 2, nothing written, without --source.
    workdir = tmp_path / "run"
    capsys.readouterr()
    argv = [f"--checkpoint={CHECKPOINT}", f"--config={ROOT / 'experiments' / 'repa.py'}:SiT-B/2"]
    assert convert_dit.main([*argv, f"--workdir={workdir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --source=repa" in err, err
    assert not workdir.exists()
