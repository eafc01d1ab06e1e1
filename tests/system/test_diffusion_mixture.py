"""A trained EDM on the 2D Gaussian mixture matches fresh real samples: its sliced Wasserstein
distance to real data is within 1.25x of the real-vs-real noise floor (the fast version of
experiments/mixture2d_score.py: 1,500 steps, 3 sets of 1,000 samples)."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest
from PIL import Image

from dew.config import apply_overrides, load_config
from dew.data.sources.mixture import RING
from dew.objectives.diffusion import Diffusion
from dew.scoring.sliced_wasserstein import ratio_to_noise_floor
from dew.training.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.execution_bound
def test_trained_edm_on_the_mixture_is_within_1_25x_of_the_noise_floor(tmp_path):
    config = apply_overrides(
        load_config(str(ROOT / "experiments" / "mixture2d.py")),
        [
            "config.train.num_steps=1500",
            "config.checkpoint.every=1500",
            "config.train.log_every=1500",
            "config.mesh.devices=1",  # a toy MLP: eight virtual devices on two cores only add all-reduces
        ],
    )
    trainer = Trainer(config, str(tmp_path / "run"))
    state = trainer.run()
    # The experiment evaluates (every 1,000 steps and at the end), ranks checkpoints by that
    # loss, and previews a scatter plot of its samples.
    evals = [
        json.loads(line)
        for line in (tmp_path / "run" / "tracking" / "scalars.jsonl").read_text().splitlines()
        if '"category": "eval"' in line
    ]
    assert [r["step"] for r in evals] == [1000, 1500]
    best = min(evals, key=lambda r: r["loss"])["step"]
    assert trainer.checkpoints is not None
    assert trainer.checkpoints.best == best and trainer.checkpoints.latest == 1500
    picture = np.asarray(Image.open(tmp_path / "run" / "previews" / "samples.png").convert("L"), np.float64)
    h, w = picture.shape
    yy, xx = np.mgrid[:h, :w]
    # The plot spans ±extent (1.15 x the largest |coordinate| of the data): the unit circle lies
    # at radius h/2/extent pixels; the ring's mass is within ±0.45 (3 std) of it, none near 0.
    assert isinstance(trainer.objective, Diffusion)
    extent = trainer.objective.extent
    assert extent is not None  # the 2-D points' plot range
    radius = np.hypot(yy - h / 2, xx - w / 2) / (h / 2) * extent
    assert picture[np.abs(radius - 1.0) < 0.15].mean() < picture[radius < 0.4].mean() - 20  # darker ring
    params = trainer.debiased_ema(state)
    draw = jax.jit(lambda rng: trainer.objective.generate(params, rng, {}, steps=18, num_samples=1000))
    model, floor, ratio = ratio_to_noise_floor(
        lambda k: np.asarray(draw(jax.random.PRNGKey(100 + k))), lambda k: RING.sample(1000, 1000 + k), sets=3
    )
    # Why 1.25: the floor is what two exact sample sets of this size score against each other,
    # so the ratio is 1 for a perfect model up to sampling noise; the 18-point Heun sampler alone
    # (on the exact mixture denoiser, experiments/RESULTS.md "sampler accuracy") adds a few
    # percent. 1.25 allows the sampler, 1,500 steps of training and the noise of 3 sets while
    # staying far below any model that misses or smears a mode (one of 8 modes missing moves an
    # eighth of the mass by ~0.77, the chord to its neighbour: a ratio of several). It is a
    # judgement bound, not derived from a distribution of the ratio.
    assert ratio < 1.25, (model, floor)
    # And it is a real comparison: an untrained model (F = 0, so D = c_skip x, the ideal
    # denoiser of N(0, σ_data² I)) samples one Gaussian blob of std 0.5 instead of the ring.
    untrained = trainer.programs.init(jax.random.PRNGKey(0), trainer.example_batch()).params
    bad = jax.jit(lambda rng: trainer.objective.generate(untrained, rng, {}, steps=18, num_samples=1000))
    _, _, bad_ratio = ratio_to_noise_floor(
        lambda k: np.asarray(bad(jax.random.PRNGKey(k))), lambda k: RING.sample(1000, 1000 + k), sets=1
    )
    # The blob's SW₂ to the ring, with the same sizes and directions, computed from exact
    # draws: a model must not be scored as close as that blob.
    blob = np.random.default_rng(7).normal(0.0, 0.5, (1000, 2)).astype(np.float32)
    _, _, blob_ratio = ratio_to_noise_floor(lambda k: blob, lambda k: RING.sample(1000, 1000 + k), sets=1)
    assert bad_ratio > 0.5 * blob_ratio > 1.25, (bad_ratio, blob_ratio)


@pytest.mark.execution_bound
def test_every_preset_trains_on_the_mixture():
    """VP, VE and the rectified flow each learn the toy from their own loss and σ distribution.

    Untrained (F = 0), the SW ratios to the noise floor are ~3,000 (VP), ~2,000 (VE) and ~7
    (flow); after 400 steps they were 1.6, 16 and 1.8 (VE, with unscaled inputs up to σ = 100,
    learns slowest; 2.8 after 1,500 steps, see experiments/RESULTS.md)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "presets_mixture", ROOT / "experiments" / "presets_mixture.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Why these bounds: this test asks whether each preset learns at all, not how well. Each
    # bound sits ~1.5-2.5x above the ratio observed after 400 steps and orders of magnitude (VP,
    # VE) or ~3x (flow) below the untrained ratio, so a preset that does not learn from its loss
    # and σ distribution fails while run-to-run noise does not. They are judgement bounds.
    for preset, bound in (("VP", 2.5), ("VE", 40.0), ("RectifiedFlow", 2.5)):
        ratio, loss = module.train_and_score(preset, steps=400)
        assert np.isfinite(loss)
        assert ratio < bound, (preset, ratio)
