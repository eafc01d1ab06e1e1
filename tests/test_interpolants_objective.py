"""The ``interpolant`` objective (SiT's transport loss) built from a config, its loss against
``Transport.training_losses`` on the same draws, a class-conditional network's call, training on
the 2-D mixture, sampling through the registered transport samplers, and bad input."""

from __future__ import annotations

import pathlib

import haiku as hk
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import dew
from dew.artifacts import ImageGrid
from dew.config import apply_overrides, load_config
from dew.diffusion.interpolants import PATHS, VPPath
from dew.diffusion.transport import Transport
from dew.inputs import Condition, Field, InputSpec
from dew.objectives.interpolant import Interpolant, Preview
from dew.sampling.transport_ode import TransportODE
from dew.sampling.transport_sde import TransportSDE
from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer_config import resolve_config

ROOT = pathlib.Path(__file__).resolve().parent.parent


def mixture_config(**objective):
    config = load_config(str(ROOT / "experiments" / "mixture2d.py"))
    config.objective = ml_collections.ConfigDict({"name": "interpolant", **objective})
    config.model = ml_collections.ConfigDict({"name": "mlp", "width": 32, "blocks": 1})
    return resolve_config(apply_overrides(config, []))


def test_config_builds_the_transport_and_the_registered_network():
    config = mixture_config(path="GVP", prediction="noise", loss_weight="likelihood")
    objective = build_objective(config, open_split(config.dataset, "train"))
    assert isinstance(objective, Interpolant) and objective.num_classes is None
    assert objective.transport == Transport("GVP", "noise", "likelihood", 1e-3, 1e-3)
    assert isinstance(objective.sampler, TransportODE) and objective.sampler.num_steps == 50


def test_the_loss_is_the_transport_loss_on_the_same_draws():
    config = mixture_config(path="VP", prediction="score", loss_weight="velocity")
    objective = build_objective(config, open_split(config.dataset, "train"))
    assert isinstance(objective, Interpolant)
    batch = {"x": jax.random.normal(jax.random.key(0), (16, 2))}
    params = objective.init(jax.random.key(1), batch)
    params = jax.tree.map(lambda p: p + 0.1, params)  # off the zero-initialised output layer
    rng = jax.random.key(2)
    loss, _ = objective.loss(params, rng, batch, Step(jnp.int32(0), is_training=False))
    t_rng, noise_rng, _ = jax.random.split(rng, 3)
    t = objective.transport.sample_t(t_rng, 16)
    assert float(t.min()) >= 0 and float(t.max()) <= 1 - 1e-5  # VP trains on [0, 1 − train_eps]
    x0 = jax.random.normal(noise_rng, (16, 2))
    terms = objective.transport.training_losses(objective.network(params, None), batch["x"], t, x0)
    np.testing.assert_allclose(loss, jnp.mean(terms["loss"]), rtol=1e-6)


def test_a_class_conditional_network_is_called_with_continuous_t_and_raw_labels():
    seen = {}

    class Probe(hk.Module):
        def __call__(self, x, t, y):
            seen["t"], seen["y"] = t, y
            scale = hk.get_parameter("scale", (), init=jnp.ones)
            return scale * x + (t[:, None] + y[:, None].astype(x.dtype))

    spec = InputSpec(Field("x", (2,)), {"label": Condition("class_label", Field("label", (), "int32"), 3)})
    objective = Interpolant(spec, Transport.create(), Probe, num_classes=3, preview=Preview(steps=4))
    batch = {"x": jnp.ones((4, 2)), "label": jnp.asarray([0, 1, 2, 1], jnp.int32)}
    params = objective.init(jax.random.key(0), batch)
    objective.loss(params, jax.random.key(1), batch, Step(jnp.int32(0)))
    assert seen["y"].dtype == jnp.int32 and seen["t"].dtype == jnp.float32 and seen["t"].shape == (4,)
    out = objective.generate(params, jax.random.key(2), jnp.asarray([0, 2], jnp.int32))
    assert out.shape == (2, 2) and np.all(np.isfinite(out))


def test_learn_sigma_networks_lose_their_variance_half_as_sits_forward_does():
    class TwoHalves(hk.Module):
        def __call__(self, x, t):
            scale = hk.get_parameter("scale", (), init=jnp.ones)
            return jnp.concatenate([scale * x, jnp.full_like(x, 1e6)], axis=-1)

    spec = InputSpec(Field("x", (3, 3, 2)))
    transport = Transport.create()
    objective = Interpolant(spec, transport, TwoHalves, learn_sigma=True)
    batch = {"x": jax.random.normal(jax.random.key(0), (2, 3, 3, 2))}
    params = objective.init(jax.random.key(1), batch)
    out = objective.network(params, None)(batch["x"], jnp.zeros(2))
    np.testing.assert_array_equal(out, batch["x"])
    loss, _ = objective.loss(params, jax.random.key(2), batch, Step(jnp.int32(0)))
    assert float(loss) < 100  # the 1e6 half never reaches the loss
    plain = Interpolant(spec, transport, TwoHalves)
    with pytest.raises(ValueError, match="the model returned shape"):
        plain.loss(plain.init(jax.random.key(1), batch), jax.random.key(2), batch, Step(jnp.int32(0)))


def test_training_lowers_the_loss_and_every_registered_sampler_draws():
    config = mixture_config()
    objective = build_objective(config, open_split(config.dataset, "train"))
    assert isinstance(objective, Interpolant)
    source = open_split(config.dataset, "train")
    batch = {"x": jnp.asarray(source.fields["x"][:256])}
    params = objective.init(jax.random.key(0), batch)
    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state, rng):
        loss, grads = jax.value_and_grad(lambda p: objective.loss(p, rng, batch, Step(jnp.int32(0)))[0])(
            params
        )
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(150):
        params, state, loss = step(params, state, jax.random.key(i))
        losses.append(float(loss))
    assert np.mean(losses[-20:]) < 0.8 * np.mean(losses[:20])
    picture = objective.preview(params, jax.random.key(5))  # 2-D points: one scatter picture
    assert isinstance(picture, ImageGrid) and picture.images.shape == (1, 96, 96, 1)
    jitted = dict(objective._jitted)
    assert len(jitted) == 1  # the points' draw, compiled once
    np.testing.assert_array_equal(objective.preview(params, jax.random.key(5)).images, picture.images)
    assert objective._jitted == jitted
    for name in (
        "transport_ode",
        "transport_ode_euler",
        "transport_ode_heun2",
        "transport_sde",
        "transport_sde_heun",
    ):
        sampler = dew.samplers[name]
        assert isinstance(sampler, TransportODE | TransportSDE)
        few = sampler.__class__(**{**sampler.__dict__, "num_steps": 6})
        out = objective.generate(params, jax.random.key(7), num=64, sampler=few)
        assert out.shape == (64, 2) and np.all(np.isfinite(out)), name


def test_the_sde_draws_its_noise_from_rng_reproducibly():
    model = lambda x, t: -x  # noqa: E731
    sampler = TransportSDE(num_steps=5)
    z = jax.random.normal(jax.random.key(0), (3, 2))
    a = sampler.sample(Transport.create(), model, z, jax.random.key(1))
    b = sampler.sample(Transport.create(), model, z, jax.random.key(1))
    c = sampler.sample(Transport.create(), model, z, jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    with pytest.raises(ValueError, match="needs rng"):
        sampler.sample(Transport.create(), model, z)


def test_each_path_is_a_rescaling_of_the_sigma_frame():
    """x_t = α_t (x1 + σ x0) with σ = ``edm_sigma(t)``; the Linear path is dew's rectified flow
    (flow time 1 − t, x_t = x/(1 + σ)) and its u_t is minus the flow target n − y."""
    t = jnp.asarray([0.1, 0.5, 0.9])
    x0, x1 = jax.random.normal(jax.random.key(0), (2, 3, 4))
    for name, path_type in PATHS.items():
        path = path_type()
        sigma, alpha = path.edm_sigma(t)[:, None], path.alpha(t)[0]
        alpha = jnp.broadcast_to(jnp.asarray(alpha), t.shape)[:, None]
        np.testing.assert_allclose(
            path.xt(t, x0, x1), alpha * (x1 + sigma * x0), rtol=2e-5, atol=2e-6, err_msg=name
        )
    linear = PATHS["Linear"]()
    sigma = linear.edm_sigma(t)[:, None]
    np.testing.assert_allclose(linear.xt(t, x0, x1), (x1 + sigma * x0) / (1 + sigma), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(linear.ut(t, x0, x1), -(x0 - x1), rtol=1e-6)


def test_vp_edm_sigma_matches_the_direct_ratio():
    t = jnp.asarray([0.2, 0.5, 0.9])
    path = VPPath()
    np.testing.assert_allclose(path.edm_sigma(t), path.sigma(t)[0] / path.alpha(t)[0], rtol=1e-5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: Transport.create(path="Cosine"),
            "path='Cosine' is unknown: expected one of ['Linear', 'GVP', 'VP']",
        ),
        (lambda: Transport.create(prediction="x0"), "prediction='x0' is unknown: expected one of"),
        (lambda: Transport.create(loss_weight="snr"), "loss_weight='snr' is unknown: expected one of"),
        (lambda: Transport.create(sample_eps=1.0), "sample_eps=1.0 is invalid: expected a float in [0, 1)"),
        (lambda: Transport.create(train_eps=-0.1), "train_eps=-0.1 is invalid"),
        (lambda: Transport.create("VP", train_eps=0.01), "sample_eps=None is invalid with train_eps=0.01"),
        (lambda: TransportODE(method="rk45"), "sampling_method='rk45' is unknown: expected one of"),
        (lambda: TransportSDE(method="Milstein"), "sampling_method='Milstein' is unknown"),
        (lambda: TransportSDE(diffusion_form="cubic"), "diffusion_form='cubic' is unknown"),
        (lambda: TransportSDE(last_step="Exact"), "last_step='Exact' is unknown"),
        (lambda: TransportSDE(last_step_size=1.5), "last_step_size=1.5 is invalid: expected a float in"),
        (lambda: TransportODE(num_steps=1), "num_steps=1 is invalid: expected an int >= 2"),
        (lambda: TransportODE(atol=0.0), "atol=0.0 is invalid: expected a float > 0"),
        (
            lambda: mixture_config(sampling={"sampler": "heun"}),
            "config.objective.sampling.sampler='heun' is unknown",
        ),
        (lambda: mixture_config(path="Cosine"), "Cosine"),
    ],
)
def test_bad_input_is_one_line_naming_the_field_value_and_accepted(call, message):
    with pytest.raises(ConfigError) as error:
        call()
    text = str(error.value)
    assert message in text and "\n" not in text
