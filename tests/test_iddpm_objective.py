"""The ``iddpm`` objective (DiT's training on the improved-DDPM process): built from a config, its
loss against ``GaussianDiffusion.training_losses`` on the same draws with DiT's uniform integer t,
class dropout while training only, guided sampling against a loop written from DiT's
``sample.py`` with the network called twice, and previews/inference through ``dew.pipeline``'s
contract."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from dew.artifacts import ImageGrid
from dew.config import apply_overrides, load_config
from dew.objectives.iddpm import IDDPM, IDDPMSampling
from dew.schema import ConfigError
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer_config import resolve_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = {"depth": 1, "hidden_size": 32, "num_heads": 2, "patch_size": 2, "num_classes": 10}


def digits_config(objective=None, **model):
    config = load_config(str(ROOT / "experiments" / "meanflow.py"))  # the digits data set
    config.objective = ml_collections.ConfigDict(
        {"name": "iddpm", "sampling": {"steps": 5, "cfg_scale": 2.0, "cfg_channels": 1, "per_class": 1}}
    )
    for key, value in (objective or {}).items():
        config.objective[key] = value
    config.model = ml_collections.ConfigDict({"name": "dit", **TINY, **model})
    return resolve_config(apply_overrides(config, []))


def built(objective=None, **model) -> tuple[IDDPM, dict, dict]:
    config = digits_config(objective, **model)
    source = open_split(config.dataset, "train")
    obj = build_objective(config, source)
    assert isinstance(obj, IDDPM)
    batch = {"image": jax.random.normal(jax.random.key(0), (6, 8, 8, 1)), "label": jnp.arange(6) % 10}
    params = obj.init(jax.random.key(1), batch)
    # off the zero-initialised adaLN and final layers, so every term depends on the weights
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    params = jax.tree.unflatten(
        tree, [p + 0.05 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys, strict=True)]
    )
    return obj, batch, params


def test_config_builds_dits_default_process():
    obj, _, _ = built()
    assert isinstance(obj, IDDPM) and obj.num_classes == 10
    d = obj.diffusion
    assert d.num_timesteps == 1000 and d.var_type == "learned_range" and d.loss_type == "mse"
    assert d.mean_type == "epsilon" and d.timestep_map == tuple(range(1000))
    assert obj.sampling == IDDPMSampling(steps=5, cfg_scale=2.0, cfg_channels=1, per_class=1)


def test_the_loss_is_the_hybrid_loss_on_the_same_draws_with_uniform_integer_t():
    obj, batch, params = built()
    rng = jax.random.key(3)
    loss, (stats, _) = obj.loss(params, rng, batch, Step(jnp.int32(0), is_training=False))
    t_rng, noise_rng, _ = jax.random.split(rng, 3)
    t = jax.random.randint(t_rng, (6,), 0, 1000)  # torch.randint(0, num_timesteps, (B,))
    noise = jax.random.normal(noise_rng, batch["image"].shape)

    def model(x, steps):
        assert steps.dtype == jnp.float32
        return obj._net.apply(params, None, x, steps, batch["label"], False)

    terms = obj.diffusion.training_losses(model, batch["image"], t, noise)
    # the same float32 graph: agreement to a few ulps of the loss (~1: eps * 8 roundings)
    np.testing.assert_allclose(loss, jnp.mean(terms["loss"]), rtol=8 * float(np.finfo(np.float32).eps))
    np.testing.assert_allclose(stats["vb"], jnp.mean(terms["vb"]), rtol=8 * float(np.finfo(np.float32).eps))
    assert float(stats["vb"]) > 0 and float(stats["mse"]) > 0


def test_class_dropout_acts_while_training_only():
    obj, batch, params = built(class_dropout_prob=0.9999999)  # every label dropped (P(keep) ~ 1e-7 per row)
    rng = jax.random.key(4)
    dropped = {**batch, "label": jnp.full((6,), 10, jnp.int32)}  # the null class given outright
    train, _ = obj.loss(params, rng, batch, Step(jnp.int32(0), is_training=True))
    null, _ = obj.loss(params, rng, dropped, Step(jnp.int32(0), is_training=False))
    held, _ = obj.loss(params, rng, batch, Step(jnp.int32(0), is_training=False))
    np.testing.assert_allclose(train, null, rtol=8 * float(np.finfo(np.float32).eps))
    assert abs(float(held) - float(train)) > 1e-4


def test_guided_sampling_is_dits_sample_py():
    obj, _, params = built()
    labels = jnp.asarray([3, 7], jnp.int32)
    rng = jax.random.key(5)
    out = obj.generate(params, rng, labels, steps=5, cfg_scale=2.0, cfg_channels=1)
    # sample.py written out: z doubled, y = [labels; null], the network called for each half,
    # guidance on the first cfg_channels channels of the output, the conditional half kept.
    diffusion = obj.process.diffusion("5")
    noise_rng, step_rng = jax.random.split(rng)
    z = jax.random.normal(noise_rng, (2, 8, 8, 1))
    z = jnp.concatenate([z, z])

    def guided(x, t):
        half = x[:2]
        cond = obj._net.apply(params, None, half, t[:2], labels, False)
        uncond = obj._net.apply(params, None, half, t[:2], jnp.full((2,), 10, jnp.int32), False)
        eps = uncond[..., :1] + 2.0 * (cond[..., :1] - uncond[..., :1])
        both = jnp.concatenate([eps, cond[..., 1:]], axis=-1)
        return jnp.concatenate([both, jnp.concatenate([eps, uncond[..., 1:]], axis=-1)])

    want = diffusion.sample_loop(guided, z, rng=step_rng, clip_denoised=False)[-1][:2]
    # the same arithmetic up to the batched-vs-split matmuls: 5 steps of float32 roundoff
    # through a network of unit-scale activations (~1e-6 each, amplified by 1/sqrt(alpha_bar))
    np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-4)
    unguided = obj.generate(params, rng, labels, steps=5, cfg_scale=1.0)
    assert float(jnp.max(jnp.abs(unguided - out))) > 1e-3


def test_preview_and_infer_draw_every_class():
    obj, _, params = built()
    grid = obj.preview(params, jax.random.key(0))
    assert isinstance(grid, ImageGrid) and grid.images.shape == (10, 8, 8, 1)
    assert set(obj.inference_options()) == {
        "classes",
        "steps",
        "cfg_scale",
        "cfg_channels",
        "method",
        "per_class",
        "seed",
    }
    again = obj.infer(params, classes=None, seed=0, **IDDPMSampling(5, 2.0, 1, "ddpm", 1).__dict__)
    np.testing.assert_array_equal(again.images, grid.images)
    assert len(obj._jitted) == 1  # the request at the preview's settings reuses its jitted draw
    two = obj.infer(params, classes=(1, 2), seed=0, **IDDPMSampling(5, 2.0, 1, "ddim", 1).__dict__)
    assert two.images.shape == (2, 8, 8, 1)
    jitted = dict(obj._jitted)
    assert len(jitted) == 2 and sum(key[0] == "classes" for key in jitted) == 1
    same = obj.infer(params, classes=(1, 2), seed=0, **IDDPMSampling(5, 2.0, 1, "ddim", 1).__dict__)
    np.testing.assert_array_equal(same.images, two.images)
    assert obj._jitted == jitted  # one program per settings: a repeated request compiles nothing


@pytest.mark.parametrize(
    ("objective", "model", "message"),
    [
        ({"sampling": {"cfg_scale": 0.5}}, {}, "config.objective.sampling.cfg_scale=0.5 is invalid"),
        ({"sampling": {"method": "euler"}}, {}, "config.objective.sampling.method='euler' is invalid"),
        ({}, {"patch_size": 3}, "patch_size=3 does not divide the latent resolution"),
    ],
)
def test_bad_input_is_one_line(objective, model, message):
    with pytest.raises(ConfigError) as e:
        built(objective, **model)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.default_compiler
def test_guided_sampling_matches_dit_sample_py_on_the_tiny_reference_network():
    """third_party/dit/dit_tiny_sample.npz: DiT's own create_diffusion("10").p_sample_loop through
    its forward_with_cfg (cfg 4.0, the batch doubled with the null class) on the tiny DiT whose
    weights are dit_tiny_state_dict.npz, with its per-step draws stored; dew's sampling model and
    loop on the same draws."""
    import json

    from dew.inputs import Condition, Field, InputSpec
    from dew.interop import dit_checkpoint
    from dew.objectives.iddpm import Process

    golden = dict(np.load(ROOT / "third_party" / "dit" / "dit_tiny_sample.npz", allow_pickle=False))
    config = json.loads(str(np.load(ROOT / "third_party" / "dit" / "dit_tiny.npz")["config_json"]))
    state = dict(np.load(ROOT / "third_party" / "dit" / "dit_tiny_state_dict.npz", allow_pickle=False))
    options = {k: config[k] for k in ("depth", "hidden_size", "num_heads", "patch_size", "num_classes")}
    params = dit_checkpoint.convert(state, "dit", options, top="dit")
    side, channels = config["input_size"], config["in_channels"]
    spec = InputSpec(
        Field("image", (side, side, channels)),
        {"label": Condition("class_label", Field("label", (), "int32"), config["num_classes"])},
    )
    import functools

    from dew import registry

    obj = IDDPM(
        spec, functools.partial(registry.models["dit"], **options), config["num_classes"], process=Process()
    )
    model, guided = obj.sampling_model(params, jnp.asarray(golden["labels"]), float(golden["cfg_scale"]), 3)
    assert guided
    z = np.ascontiguousarray(golden["z"].transpose(0, 2, 3, 1))
    noises = np.ascontiguousarray(golden["noises"].transpose(0, 1, 3, 4, 2))
    diffusion = obj.process.diffusion(str(int(golden["steps"])))
    out = diffusion.sample_loop(
        model, jnp.concatenate([z, z]), step_noises=jnp.asarray(noises), clip_denoised=False, trajectory=False
    )[:2]
    want = golden["samples"].transpose(0, 2, 3, 1)
    # tests/test_dit.py's per-call bound for guided output (9 · 4·12·16 u, relative to the
    # output's magnitude), added once per step: the loop's linear maps (x / sqrt(alpha_t), the
    # noise added) amplify the state and its error alike, so relative errors add step by step
    bound = int(golden["steps"]) * 9 * 4 * 12 * 16 * 2.0**-24 * float(np.max(np.abs(want)))
    np.testing.assert_allclose(out, want, atol=bound, rtol=0)
