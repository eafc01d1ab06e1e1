"""Classifier-free guidance in the ``interpolant`` objective's sampling: SiT's ``sample.py``
(z doubled with the null class, ``forward_with_cfg`` on the first ``cfg_channels`` channels, the
first half kept) against the same loop written with the network called once per half, REPA's
guidance interval, and the options ``dew.pipeline`` passes."""

from __future__ import annotations

import dataclasses
import functools
from typing import TypedDict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import registry
from dew.artifacts import ImageGrid
from dew.diffusion.transport import Transport
from dew.inputs import Condition, Field, InputSpec
from dew.objectives.interpolant import Guidance, Interpolant, Preview, transport_sampler

TINY = {"depth": 1, "hidden_size": 32, "num_heads": 2, "patch_size": 2, "num_classes": 10}
# float32 roundoff of the same arithmetic batched two ways, over 4 steps of unit-scale values


class Tolerance(TypedDict):
    atol: float
    rtol: float


TOL: Tolerance = {"atol": 1e-5, "rtol": 1e-5}


def objective(sampler: str = "transport_sde", **preview) -> tuple[Interpolant, dict]:
    import dew  # noqa: F401  (fills the registries)

    spec = InputSpec(
        Field("image", (8, 8, 3)), {"label": Condition("class_label", Field("label", (), "int32"), 10)}
    )
    model = functools.partial(registry.models["sit"], **TINY)
    settings = Preview(sampler=sampler, steps=4, per_class=1, cfg_channels=2, **preview)
    obj = Interpolant(spec, Transport.create(), model, num_classes=10, preview=settings)
    batch = {"image": jnp.zeros((2, 8, 8, 3)), "label": jnp.arange(2)}
    params = obj.init(jax.random.key(0), batch)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [p + 0.1 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys, strict=True)]
    return obj, jax.tree.unflatten(tree, noisy)


def written_out(obj: Interpolant, params, labels, scale: float, interval=(0.0, 1.0)):
    """sample.py's loop with each half of the doubled batch through the plain network."""
    null = jnp.full(labels.shape, 10, jnp.int32)

    def model(x, t, guide_time=None):  # REPA's Heun corrector decides at its step's start
        n = x.shape[0] // 2
        cond = obj._net.apply(params, None, x[:n], t[:n], labels)
        uncond = obj._net.apply(params, None, x[:n], t[:n], null)
        guided = uncond[..., :2] + scale * (cond[..., :2] - uncond[..., :2])
        now = t[0] if guide_time is None else guide_time[0]
        inside = (now >= interval[0]) & (now <= interval[1])
        first = jnp.where(inside, jnp.concatenate([guided, cond[..., 2:]], -1), cond)
        return jnp.concatenate(
            [first, jnp.where(inside, jnp.concatenate([guided, uncond[..., 2:]], -1), uncond)]
        )

    return model


@pytest.mark.parametrize(
    "sampler", ["transport_sde", "transport_ode_heun2", "repa_sde", "repa_ode", "repa_ode_heun"]
)  # fixed grids
@pytest.mark.parametrize("interval", [(0.0, 1.0), (0.5, 1.0)])
def test_guided_sampling_is_sample_py_written_out(sampler, interval):
    obj, params = objective(sampler)
    labels = jnp.asarray([3, 7], jnp.int32)
    rng = jax.random.key(2)
    out = obj.generate(params, rng, labels, guidance=Guidance(3.0, 2, interval))
    noise_rng, step_rng = jax.random.split(rng)
    z = jax.random.normal(noise_rng, (2, 8, 8, 3))
    want = obj.sampler.sample(
        obj.transport, written_out(obj, params, labels, 3.0, interval), jnp.concatenate([z, z]), step_rng
    )[:2]
    np.testing.assert_allclose(out, want, **TOL)
    plain = obj.generate(params, rng, labels, guidance=Guidance())
    assert float(jnp.max(jnp.abs(plain - out))) > 1e-3


def test_the_interval_limits_guidance():
    obj, params = objective("transport_sde")
    labels = jnp.asarray([3, 7], jnp.int32)
    rng = jax.random.key(3)
    # SDE Euler over 4 steps visits t = 0, 1/4, ... : an interval past them all is no guidance
    none = obj.generate(params, rng, labels, guidance=Guidance(3.0, 2, (0.995, 1.0)))
    full = obj.generate(params, rng, labels, guidance=Guidance(3.0, 2, (0.0, 1.0)))
    part = obj.generate(params, rng, labels, guidance=Guidance(3.0, 2, (0.5, 1.0)))
    noise_rng, step_rng = jax.random.split(rng)
    z = jax.random.normal(noise_rng, (2, 8, 8, 3))
    plain = obj.sampler.sample(
        obj.transport,
        obj.network(params, jnp.concatenate([labels, labels + 0])),
        jnp.concatenate([z, z]),
        step_rng,
    )[:2]
    np.testing.assert_allclose(none, plain, **TOL)
    assert float(jnp.max(jnp.abs(part - full))) > 1e-4 and float(jnp.max(jnp.abs(part - none))) > 1e-4


def test_preview_and_infer_take_the_guidance_settings():
    obj, params = objective("transport_ode", cfg_scale=2.0, guidance_interval=(0.3, 1.0))
    grid = obj.preview(params, jax.random.key(0))
    assert isinstance(grid, ImageGrid) and grid.images.shape == (10, 8, 8, 3)
    options = obj.inference_options()
    assert options["cfg_scale"] == 2.0 and options["guidance_interval"] == (0.3, 1.0)
    args = {k: v for k, v in options.items() if k not in ("classes", "seed")}
    again = obj.infer(params, classes=None, seed=0, **args)
    np.testing.assert_array_equal(again.images, grid.images)
    unguided = obj.infer(params, classes=None, seed=0, **{**args, "cfg_scale": 1.0})
    assert np.max(np.abs(unguided.images - grid.images)) > 1e-4
    two = obj.infer(params, classes=(1, 2), seed=0, **args)
    assert two.images.shape == (2, 8, 8, 3)
    jitted = dict(obj._jitted)  # the preview's draw (reused by `again`), the unguided one, the classes'
    assert len(jitted) == 3 and sum(key[0] == "classes" for key in jitted) == 1
    np.testing.assert_array_equal(obj.infer(params, classes=(1, 2), seed=0, **args).images, two.images)
    np.testing.assert_array_equal(obj.preview(params, jax.random.key(0)).images, grid.images)
    assert obj._jitted == jitted  # one program per settings: repeated requests compile nothing
    assert dataclasses.replace(transport_sampler("transport_sde"), num_steps=4).num_steps == 4


@pytest.mark.parametrize(
    ("guidance", "message"),
    [
        ({"cfg_scale": 0.5}, "cfg_scale=0.5 is invalid: expected a float >= 1"),
        ({"guidance_interval": (0.8, 0.2)}, "guidance_interval=(0.8, 0.2) is invalid"),
        ({"cfg_channels": 0}, "cfg_channels=0 is invalid"),
    ],
)
def test_bad_guidance_is_one_line(guidance, message):
    obj, params = objective("transport_ode")
    args = {k: v for k, v in obj.inference_options().items() if k not in ("classes", "seed")}
    with pytest.raises(ValueError) as e:
        obj.infer(params, classes=None, seed=0, **{**args, **guidance})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_class_dropout_acts_while_training_only():
    """DiT/SiT networks drop labels to the null class only when called with is_training=True."""
    import dew  # noqa: F401
    from dew.training.objective import Step

    spec = InputSpec(
        Field("image", (8, 8, 3)), {"label": Condition("class_label", Field("label", (), "int32"), 10)}
    )
    model = functools.partial(registry.models["sit"], **{**TINY, "class_dropout_prob": 0.9999999})
    obj = Interpolant(spec, Transport.create(), model, num_classes=10, preview=Preview(steps=4))
    batch = {"image": jax.random.normal(jax.random.key(0), (4, 8, 8, 3)), "label": jnp.arange(4)}
    _, params = objective()
    null = {**batch, "label": jnp.full((4,), 10, jnp.int32)}
    rng = jax.random.key(5)
    train, _ = obj.loss(params, rng, batch, Step(jnp.int32(0), is_training=True))
    dropped, _ = obj.loss(params, rng, null, Step(jnp.int32(0), is_training=False))
    held, _ = obj.loss(params, rng, batch, Step(jnp.int32(0), is_training=False))
    np.testing.assert_allclose(train, dropped, rtol=8 * float(np.finfo(np.float32).eps))
    assert abs(float(train) - float(held)) > 1e-4
