"""The ``meanflow`` and ``imeanflow`` objectives through dew's machinery: built from a config,
their loss the pure loss on the step's draws, sampling on a schedule, the U-Net's optional second
time input, a short run through the Trainer read back by ``dew.pipeline``, and bad input (one
line, exit 2, nothing written). Parity with the references' own code is
tests/test_meanflow_parity.py and tests/test_imeanflow_parity.py."""

from __future__ import annotations

import subprocess
import sys

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_cli import dew_stderr, env
from helpers_common import ROOT

from dew import registry
from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import Condition, Field, InputSpec
from dew.objectives.imeanflow import IMeanFlow, IMFSampling
from dew.objectives.imeanflow_loss import IMFGuidance, draw_imf, imf_loss
from dew.objectives.meanflow import MeanFlow, MeanFlowSampling
from dew.objectives.meanflow_loss import Guidance, TimeSampling, Weighting, draw_meanflow, meanflow_loss
from dew.sampling.meanflow import check_schedule, sample_mean_flow
from dew.schema import ConfigError
from dew.training.objective import Step

TINY_UNET = {"name": "unet", "channels": 8, "channel_mult": (1,), "num_blocks": 1, "attn_resolutions": ()}


def config(model=TINY_UNET, **overrides):
    from dew.config import apply_overrides, load_config

    c = load_config(str(ROOT / "experiments" / "meanflow.py"))
    c.model = type(c.model)(model)
    small = {
        "dataset.batch_size": 8,
        "objective.sampling.per_class": 1,
        "train.num_steps": 2,
        "train.log_every": 1,
        "checkpoint.every": 2,
        "eval.every": 2,
        "eval.num_batches": 1,
        "preview.every": 2,
        "preview.metrics": "()",
        "mesh.devices": 1,
    }
    return apply_overrides(c, [f"config.{k}={v}" for k, v in {**small, **overrides}.items()])


def batch(n=4):
    g = np.random.default_rng(0)
    return {
        "image": jnp.asarray(g.uniform(-1, 1, (n, 8, 8, 1)), jnp.float32),
        "label": jnp.asarray(g.integers(0, 10, n), jnp.int32),
    }


def spec():
    return InputSpec(
        Field("image", (8, 8, 1)),
        {"label": Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)},
    )


def unet():
    return registry.models["unet"](channels=8, channel_mult=(1,), num_blocks=1, attn_resolutions=())


def encoder():
    return registry.encoders["class_label"](10)


# --- the U-Net's second time input ---------------------------------------------------------------
def test_the_unet_without_h_is_unchanged_and_with_h_reads_it():
    x, t = batch()["image"], jnp.linspace(0.1, 0.9, 4)
    plain = hk.transform(lambda x, t: unet()(x, t))
    with_h = hk.transform(lambda x, t, h: unet()(x, t, h))
    p = plain.init(jax.random.PRNGKey(0), x, t)
    q = with_h.init(jax.random.PRNGKey(0), x, t, t)
    # Without h: no new parameter (with h, map_h is one more, drawn before the blocks').
    assert set(q) - set(p) == {"u_net/map_h"}
    # Zero-initialised output layers make a fresh U-Net output 0: give it weights that read h.
    q = jax.tree.map(lambda a: a + 0.05 * jnp.cos(jnp.arange(a.size).reshape(a.shape)), q)
    p2 = {k: v for k, v in q.items() if k != "u_net/map_h"}
    out_plain = plain.apply(p2, None, x, t)
    out_h0 = with_h.apply(q, None, x, t, jnp.zeros(4))
    out_h = with_h.apply(q, None, x, t, t)
    assert not np.allclose(out_h, out_h0)  # h is read
    assert not np.allclose(out_plain, out_h0)  # h = 0 is an input, not the absence of one


# --- the objectives are their pure losses on the step's draws ------------------------------------
def test_meanflow_loss_is_the_pure_loss_on_its_draws():
    times, guidance, weighting = TimeSampling(), Guidance(class_dropout_prob=0.5, t_start=0.2), Weighting()
    objective = MeanFlow(spec(), unet, encoder, 10, times=times, guidance=guidance, weighting=weighting)
    b, rng = batch(), jax.random.PRNGKey(3)
    params = objective.init(jax.random.PRNGKey(0), b)
    params = jax.tree.map(lambda a: a + 0.05 * jnp.sin(jnp.arange(a.size).reshape(a.shape)), params)
    loss, (stats, _) = jax.jit(lambda p: objective.loss(p, rng, b, Step(jnp.int32(0))))(params)

    def pure(p):
        draw_rng, net_rng = jax.random.split(rng)
        draws = draw_meanflow(draw_rng, b["image"], times)
        u = objective.average_velocity(p, net_rng, True)
        guide = objective.average_velocity(p, net_rng, False)
        return meanflow_loss(
            u, b["image"], b["label"], draws, times, guidance, weighting, UNCONDITIONAL, guide
        )

    expected = jax.jit(pure)(params)
    np.testing.assert_allclose(loss, expected.loss, rtol=1e-6)
    np.testing.assert_allclose(stats["v_loss"], jnp.mean(expected.v_loss), rtol=1e-6)
    grads = jax.jit(jax.grad(lambda p: objective.loss(p, rng, b, Step(jnp.int32(0)))[0]))(params)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    assert float(jnp.abs(grads["u_net/map_h"]["w"]).sum()) > 0  # h reaches the network


class TinyIMF(hk.Module):
    """A small network with iMF's interface, (x, t, h; ω, t_min, t_max, label) -> (u, v)."""

    def __call__(self, x, t, h, *, omega, t_min, t_max, label, is_training):
        c = jnp.stack([t, h, 1 - 1 / omega, t_min, t_max], axis=-1)
        e = jnp.tanh(hk.Linear(16)(jnp.concatenate([c, label], axis=-1)))
        flat = x.reshape(x.shape[0], -1)
        a = jnp.tanh(hk.Linear(16)(flat) + e)
        return hk.Linear(flat.shape[1])(a).reshape(x.shape), hk.Linear(flat.shape[1])(a).reshape(x.shape)


def test_imeanflow_loss_is_the_pure_loss_and_it_samples_at_a_guidance_scale():
    times, guidance, weighting = TimeSampling(data_proportion=0.5), IMFGuidance(), Weighting()
    sampling = IMFSampling(schedule=(1.0, 0.5, 0.0), per_class=2, omega=4.0, t_min=0.3, t_max=0.7)
    objective = IMeanFlow(
        spec(), TinyIMF, encoder, 10, times=times, guidance=guidance, weighting=weighting, sampling=sampling
    )
    b, rng = batch(), jax.random.PRNGKey(3)
    params = objective.init(jax.random.PRNGKey(0), b)
    loss, _ = jax.jit(lambda p: objective.loss(p, rng, b, Step(jnp.int32(0))))(params)

    def pure(p):
        draw_rng, net_rng = jax.random.split(rng)
        net = objective.imf_network(p, net_rng, True)
        return imf_loss(
            net, b["image"], b["label"], draw_imf(draw_rng, b["image"]), times, guidance, weighting, -1
        )

    expected = jax.jit(pure)(params)
    np.testing.assert_allclose(loss, expected.loss, rtol=1e-6)
    grid = objective.preview(params, jax.random.PRNGKey(0))
    assert grid.images.shape == (20, 8, 8, 1) and np.isfinite(grid.images).all()
    assert objective.inference_options()["omega"] == 4.0


def test_generate_is_the_schedule_of_mean_flow_steps():
    objective = MeanFlow(spec(), unet, encoder, 10, sampling=MeanFlowSampling(schedule=(1.0, 0.4, 0.0)))
    b = batch()
    params = objective.init(jax.random.PRNGKey(0), b)
    params = jax.tree.map(lambda a: a + 0.05 * jnp.sin(jnp.arange(a.size).reshape(a.shape)), params)
    rng = jax.random.PRNGKey(5)
    out = objective.generate(params, rng, b["label"], schedule=(1.0, 0.4, 0.0))
    u = objective.average_velocity(params, None, False)
    z = jax.random.normal(rng, b["image"].shape)
    for t, r in ((1.0, 0.4), (0.4, 0.0)):
        tb, rb = jnp.full((4,), t), jnp.full((4,), r)
        z = z - (t - r) * u(z, tb, tb - rb, b["label"])
    np.testing.assert_allclose(out, z, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "schedule", [(1.0,), (0.5, 0.0), (1.0, 0.5), (1.0, 0.5, 0.5, 0.0), (1.0, 0.6, 0.7, 0.0)]
)
def test_a_schedule_not_decreasing_from_1_to_0_is_refused(schedule):
    with pytest.raises(ValueError, match=r"schedule=.* is invalid: expected t points strictly decreasing"):
        check_schedule(schedule)
    with pytest.raises(ValueError, match="schedule="):
        sample_mean_flow(lambda z, t, h: z, jnp.zeros((1, 2)), schedule)


class LabelsAsInts(hk.Module):
    """A network that takes classes as DiT does: net(x, t, y, *, h, is_training), y int labels
    with the null class ``num_classes`` (its table's last row)."""

    def __init__(self, num_classes: int = 10, time_inputs=("t", "h"), name=None):
        super().__init__(name=name)
        self.num_classes = num_classes

    def __call__(self, x, t, y, *, h=None, is_training=False):
        assert h is not None  # the objective passes its second time input
        table = hk.get_parameter("table", (self.num_classes + 1, 4), init=hk.initializers.RandomNormal())
        c = jnp.concatenate([jnp.stack([t, h], -1), table[y]], -1)
        return x * hk.Linear(1)(c)[:, :, None, None] + hk.Linear(x.shape[-1])(c)[:, None, None, :]


if "meanflow_test_labels_as_ints" not in registry.models:
    registry.models.register("meanflow_test_labels_as_ints", LabelsAsInts)


def test_a_network_taking_int_labels_gets_them_with_its_null_class():
    from dew.training.build import open_split
    from dew.training.trainer_config import resolve_config

    c = resolve_config(config(model={"name": "meanflow_test_labels_as_ints", "time_inputs": ("t", "h")}))
    objective = MeanFlow.from_config(c, open_split(c.dataset, "train"))
    assert objective.label_input == "y" and objective.null_label == 10
    b = batch()
    params = objective.init(jax.random.PRNGKey(0), b)
    seen = []

    def u(z, t, h, y):
        seen.append(y)
        return objective.average_velocity(params, None, False)(z, t, h, y)

    draws = draw_meanflow(jax.random.PRNGKey(1), b["image"], objective.times)
    drop_all = type(draws)(draws.t_raw, draws.r_raw, draws.noise, jnp.zeros(4))  # every row dropped
    meanflow_loss(
        u, b["image"], b["label"], drop_all, objective.times, objective.guidance, objective.weighting, 10
    )
    assert [int(v) for v in seen[-1]] == [10] * 4  # the JVP's labels: the null class, as DiT's
    # Built without the h embedder, a time_inputs network is refused before anything runs.
    with pytest.raises(ConfigError, match=r"config.model.time_inputs=\('t',\) is invalid"):
        MeanFlow.from_config(
            resolve_config(config(model={"name": "meanflow_test_labels_as_ints", "time_inputs": ("t",)})),
            open_split(c.dataset, "train"),
        )


# --- through the Trainer and dew.pipeline --------------------------------------------------------
def test_a_short_run_trains_previews_and_samples_through_the_pipeline(tmp_path):
    from dew.inference import pipeline
    from dew.training.trainer import Trainer

    Trainer(config(), str(tmp_path / "run")).run()
    assert (tmp_path / "run" / "previews" / "samples.png").is_file()
    task = pipeline(str(tmp_path / "run"))
    assert task.options == {"classes": None, "schedule": (1.0, 0.0), "per_class": 1, "seed": 0}
    grid = task(seed=0)
    assert grid.images.shape == (10, 8, 8, 1) and np.isfinite(grid.images).all()
    two = task(classes=(3, 7), schedule=(1.0, 0.5, 0.0))
    assert two.images.shape == (2, 8, 8, 1)
    with pytest.raises(ValueError, match="schedule"):
        task(schedule=(0.5, 0.0))


# --- bad input: one line, exit 2, nothing written ------------------------------------------------
BAD = {
    "data_proportion": (
        {"objective.data_proportion": 1.5},
        "config.objective.data_proportion=1.5 is invalid",
    ),
    "schedule": ({"objective.sampling.schedule": "(1.0,0.5,0.7,0.0)"}, "config.objective.sampling.schedule="),
    "no second time input": ({"model": {"name": "mlp"}}, "config.model.name='mlp' is invalid: the meanflow"),
    "guidance without classes": ({"objective.condition": "none"}, "guidance or class dropout is set"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_settings_are_a_config_error_before_anything_is_written(tmp_path, case):
    from dew.training.trainer import Trainer

    overrides, message = dict(BAD[case][0]), BAD[case][1]
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        Trainer(config(**overrides), str(tmp_path / "run"))  # model= replaces config.model
    assert not any(tmp_path.iterdir())


def test_the_cli_says_one_line_and_exits_2(tmp_path):
    argv = [
        sys.executable,
        "-m",
        "dew.main",
        f"--config={ROOT / 'experiments' / 'meanflow.py'}",
        f"--workdir={tmp_path / 'run'}",
        "--config.objective.data_proportion=1.5",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=600)
    lines = dew_stderr(result)
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "config.objective.data_proportion=1.5 is invalid" in lines[0], lines
    assert not (tmp_path / "run").exists()
