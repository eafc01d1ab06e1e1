"""The FID protocol (``dew.scoring.fid_protocol.Draw``) with the presets that draw through DiT's,
SiT's and REPA's own samplers (``dew.objectives.protocol_presets``): an image is a function of its
seed alone (not of how seeds are batched), a draw interrupted by ``max_chunks`` and resumed on
other devices ends on the sums and progress file of a draw never interrupted, and the progress
records the preset.

The models are ``experiments/sit.py:digits`` and ``experiments/dit.py:digits`` shrunk to one
32-wide block, their random weights jittered off adaLN-Zero's zeros so the output depends on
the class and the guidance; each preset runs at 3 steps. The detector is test_fid_protocol's
integer projection of the uint8 pixels (exact in float32 in any order), so everything compares
bit for bit and the test measures the protocol, not the Inception network."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import ROOT
from test_fid_protocol import projection

from dew.config import load_config
from dew.objectives import protocol_presets as pp
from dew.scoring import fid_protocol as fp
from dew.training.build import build_objective, open_split
from dew.training.trainer_config import resolve_config

NUM, CHUNK, FIRST = 7, 3, 40
RUNS = {"sit": "sit.py", "repa": "sit.py", "dit": "dit.py"}


def tiny(experiment: str):
    """(objective, jittered random params) of ``experiments/<experiment>:digits`` at one block."""
    config = load_config(f"{ROOT / 'experiments' / experiment}:digits")
    config.model.update({"depth": 1, "hidden_size": 32, "num_heads": 2})
    config = resolve_config(config)
    source = open_split(config.dataset, "train")
    objective = build_objective(config, source)
    example = {k: jnp.zeros((2, *v.shape[1:]), v.dtype) for k, v in source.fields.items()}
    params = jax.jit(objective.init)(jax.random.PRNGKey(0), example)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    jittered = [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys, strict=True)]
    return objective, jax.tree.unflatten(tree, jittered)


@pytest.fixture(scope="module")
def models():
    return {experiment: tiny(experiment) for experiment in sorted(set(RUNS.values()))}


def few_steps(name: str) -> pp.ObjectivePreset:
    return dataclasses.replace(pp.OBJECTIVE_PRESETS[name], steps=3)


def _draw(objective, params, preset, outdir, devices) -> fp.Draw:
    return fp.Draw(
        objective,
        params,
        preset,
        projection(),
        num=NUM,
        first_seed=FIRST,
        batch=2,
        chunk=CHUNK,
        outdir=str(outdir),
        devices=devices,
        log=lambda line: None,
    )


def by_hand(objective, params, preset: pp.ObjectivePreset, seed: int) -> np.ndarray:
    """Seed ``seed``'s sample (before quantisation) as ``fid_protocol``'s docstring says, through
    the objective's own pieces: noise from fold_in(key, 0), the class from fold_in(key, 1), step
    noise from fold_in(key, 2), the batch [z; z] with the null class, the first half kept."""
    from dew.objectives.interpolant import Guidance, transport_sampler

    key = jax.random.PRNGKey(seed)
    z = jax.random.normal(jax.random.fold_in(key, 0), (1, 8, 8, 1))
    label = jax.random.randint(jax.random.fold_in(key, 1), (1,), 0, 10)
    rng = jax.random.fold_in(key, 2)
    zz = jnp.concatenate([z, z])
    if preset.objective == "iddpm":
        model, guided = objective.sampling_model(params, label, preset.cfg_scale, preset.cfg_channels)
        assert guided
        loop = objective.process.diffusion(str(preset.steps)).sample_loop
        x = loop(model, zz, rng=rng, clip_denoised=False, method="ddpm", trajectory=False)[:1]
    else:
        sampler = dataclasses.replace(transport_sampler(preset.sampler), num_steps=preset.steps)
        guidance = Guidance(preset.cfg_scale, preset.cfg_channels, preset.guidance_interval)
        model = objective.guided_network(params, label, guidance)
        x = sampler.sample(objective.transport, model, zz, rng)[:1]
    return np.asarray(x)[0]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_presets_draw_each_seed_alone_and_resume_to_the_straight_draw(models, name, tmp_path):
    objective, params = models[RUNS[name]]
    preset = few_steps(name)
    assert pp.resolve(name, objective) is pp.OBJECTIVE_PRESETS[name]
    draw = jax.jit(lambda p, s: fp.draw_images(objective, p, s, preset))
    batch = np.asarray(draw(params, jnp.array([7, 3, 5, 9], jnp.int32)))
    assert batch.dtype == np.uint8 and batch.shape == (4, 8, 8, 1)
    assert len({b.tobytes() for b in batch}) == 4
    np.testing.assert_array_equal(np.asarray(draw(params, jnp.array([5], jnp.int32)))[0], batch[2])

    # before quantisation (a random DiT's samples run far outside [-1, 1] and clip to 0 or 255):
    # float32 roundoff (2**-24) x ~1e3 operations per step x 3 steps, relative to the largest value
    samples = np.asarray(jax.jit(preset.draw_samples, static_argnums=0)(objective, params, jnp.array([5])))
    expected = by_hand(objective, params, preset, 5)
    np.testing.assert_allclose(samples[0], expected, rtol=0, atol=3e3 * 2**-24 * np.abs(expected).max())

    straight = _draw(objective, params, preset, tmp_path / "straight", jax.devices()[:2])
    sums = straight.run()
    assert sums is not None and sums.count == NUM
    assert straight.settings()["preset"] == name and straight.settings()["steps"] == 3
    cut = _draw(objective, params, preset, tmp_path / "cut", jax.devices()[:1])
    assert cut.run(max_chunks=1) is None
    assert fp.read_progress(str(tmp_path / "cut"), cut.settings(), 6)[0] == 1
    resumed = _draw(objective, params, preset, tmp_path / "cut", jax.devices()[2:4]).run()
    assert resumed is not None
    np.testing.assert_array_equal(resumed.total, sums.total)
    np.testing.assert_array_equal(resumed.outer, sums.outer)
    progress = (tmp_path / "straight" / fp.PROGRESS_FILE).read_bytes()
    assert (tmp_path / "cut" / fp.PROGRESS_FILE).read_bytes() == progress
    # the features are the seeds' own images, embedded
    images = np.asarray(draw(params, jnp.arange(FIRST, FIRST + NUM, dtype=jnp.int32)))
    features = np.repeat(images, 3, axis=-1).reshape(NUM, -1).astype(np.float32) @ np.asarray(
        projection().params
    )
    np.testing.assert_array_equal(sums.total, features.astype(np.float64).sum(0))
