"""The EDM paper's FID protocol (``dew.scoring.fid_protocol``): seeds index images, a draw over
8 devices equals one over 1, an interrupted draw resumed equals one never interrupted, and the
``--preset`` command's bad input is one line, exit 2, nothing written.

The model is a tiny class-conditional MLP denoiser on the digits (8x8 grey, 10 classes) with
random weights; the detector is an integer projection of the uint8 pixels (exact in float32 in
any order), so the statistics compare bit for bit and the test measures the protocol, not the
Inception network (tested in test_inception.py / test_fid_reference.py)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import tiny_config
from ml_collections import ConfigDict

from dew.sampling import sample
from dew.scoring import fid_protocol as fp
from dew.scoring.fid_detector import Detector
from dew.scoring.fid_reference import FidInputError, MomentSums

FEW_STEPS = {name: dataclasses.replace(p, steps=4) for name, p in fp.PRESETS.items()}


def mlp_config():
    config = tiny_config(
        **{
            "train.num_steps": 2,
            "checkpoint.every": 2,
            "checkpoint.keep_best": False,
            "eval.every": 0,
            "preview.every": 0,
        }
    )
    config.model = ConfigDict({"name": "mlp", "width": 32, "blocks": 1, "residual": True})
    return config


def build_model():
    """(objective, random params): the same in every process (PRNGKey(0))."""
    from dew.training.build import build_objective, open_split

    config = mlp_config()
    source = open_split(config.dataset, "train")
    objective = build_objective(config, source)
    example = {k: jnp.zeros((2, *v.shape[1:]), v.dtype) for k, v in source.fields.items()}
    params = jax.jit(objective.init)(jax.random.PRNGKey(0), example)
    return objective, params


@pytest.fixture(scope="module")
def model():
    return build_model()


def projection() -> Detector:
    matrix = np.random.default_rng(5).integers(-2, 3, (8 * 8 * 3, 6)).astype(np.float32)
    return Detector(
        lambda m, x: x.reshape(x.shape[0], -1).astype(jnp.float32) @ m, jnp.asarray(matrix), 6, "proj"
    )


def test_presets_are_the_papers_sampler_settings():
    assert fp.PRESETS["cifar10"].settings() == {"preset": "cifar10", "steps": 18, "solver": "heun", "nfe": 35}
    assert fp.PRESETS["ffhq"].nfe == fp.PRESETS["afhqv2"].nfe == 79
    imagenet = fp.PRESETS["imagenet64"].settings()
    assert imagenet == {
        "preset": "imagenet64",
        "steps": 256,
        "solver": "edm_stochastic",
        "nfe": 511,
        "S_churn": 40.0,
        "S_min": 0.05,
        "S_max": 50.0,
        "S_noise": 1.003,
    }
    with pytest.raises(FidInputError, match=r"--preset='cifar100' is not a sampler preset; expected one of"):
        fp.preset("cifar100")


@pytest.mark.parametrize("name", ["cifar10", "imagenet64"])
def test_each_image_is_a_function_of_its_seed_alone(model, name):
    objective, params = model
    sampler = FEW_STEPS[name]
    draw = jax.jit(lambda p, s: fp.draw_images(objective, p, s, sampler))
    batch = np.asarray(draw(params, jnp.array([7, 3, 5, 9], jnp.int32)))
    assert batch.dtype == np.uint8 and batch.shape == (4, 8, 8, 1)
    np.testing.assert_array_equal(np.asarray(draw(params, jnp.array([5], jnp.int32)))[0], batch[2])

    # the contract written out for seed 9: key PRNGKey(9); noise from fold_in 0, class from
    # fold_in 1, the stochastic sampler's noise from fold_in 2; quantised as generate.py's PNGs.
    # Compiled for one image, as draw_images compiles a batch of one: the same arithmetic.
    def by_hand(p, seed):
        key = jax.random.PRNGKey(seed)
        noise = jax.random.normal(jax.random.fold_in(key, 0), (1, 8, 8, 1))
        label = jax.random.randint(jax.random.fold_in(key, 1), (1,), 0, 10)
        with jax.ensure_compile_time_eval():
            sigmas = objective.process.sigmas(4)
        x = sample(
            objective.denoiser(p, {"label": label}),
            noise,
            sigmas,
            sampler.solver_object(),
            rng=jax.random.fold_in(key, 2),
        )
        return jnp.clip(x * 127.5 + 128, 0, 255).astype(jnp.uint8)

    expected = np.asarray(jax.jit(by_hand)(params, 9))
    np.testing.assert_array_equal(expected, np.asarray(draw(params, jnp.array([9], jnp.int32))))
    np.testing.assert_array_equal(expected[0], batch[3])


def _draw(model, outdir, devices, **kw) -> fp.Draw:
    objective, params = model
    settings: dict[str, Any] = dict(num=11, first_seed=20, batch=2, chunk=5)
    settings.update(kw)
    return fp.Draw(
        objective,
        params,
        FEW_STEPS["cifar10"],
        projection(),
        outdir=str(outdir),
        devices=devices,
        log=lambda line: None,
        **settings,
    )


def _completed(draw: fp.Draw) -> MomentSums:
    """``draw.run()`` with no ``max_chunks``: the complete sums it must then give."""
    sums = draw.run()
    assert sums is not None
    return sums


def _features_directly(model, seeds) -> np.ndarray:
    objective, params = model
    images = np.asarray(
        jax.jit(lambda p, s: fp.draw_images(objective, p, s, FEW_STEPS["cifar10"]))(
            params, jnp.asarray(seeds, jnp.int32)
        )
    )
    images = np.repeat(images, 3, axis=-1).reshape(len(seeds), -1).astype(np.float32)
    return images @ np.asarray(projection().params)


def test_a_draw_sharded_over_8_devices_equals_one_device_and_the_seeds_features(model, tmp_path):
    assert jax.device_count() >= 8
    eight = _completed(_draw(model, tmp_path / "eight", jax.devices()[:8]))
    one = _completed(_draw(model, tmp_path / "one", jax.devices()[:1]))
    assert eight.count == one.count == 11
    np.testing.assert_array_equal(eight.total, one.total)
    np.testing.assert_array_equal(eight.outer, one.outer)
    # and they are the statistics of seeds 20..30's images (features exact integers, so the
    # sums are exact in float64 whatever the grouping)
    direct = MomentSums()
    direct.add(_features_directly(model, np.arange(20, 31)))
    np.testing.assert_array_equal(eight.total, direct.total)
    np.testing.assert_array_equal(eight.outer, direct.outer)


def test_an_interrupted_draw_resumed_ends_with_the_uninterrupted_statistics(model, tmp_path):
    os.makedirs(tmp_path / "whole")
    whole = _completed(_draw(model, tmp_path / "whole", jax.devices()[:2]))
    os.makedirs(tmp_path / "cut")
    assert _draw(model, tmp_path / "cut", jax.devices()[:2]).run(max_chunks=1) is None
    with np.load(tmp_path / "cut" / fp.PROGRESS_FILE) as progress:
        assert int(progress["chunks_done"]) == 1 and int(progress["count"]) == 5
    assert os.listdir(tmp_path / "cut") == [fp.PROGRESS_FILE]  # no temporary file left behind
    # a fresh process's view: a new Draw reading the progress file, on other devices
    resumed = _completed(_draw(model, tmp_path / "cut", jax.devices()[4:8]))
    assert resumed.count == whole.count == 11
    np.testing.assert_array_equal(resumed.total, whole.total)
    np.testing.assert_array_equal(resumed.outer, whole.outer)
    np.testing.assert_array_equal(resumed.mu_sigma()[1], whole.mu_sigma()[1])
    # a progress file made with other settings is refused, naming what differs
    with pytest.raises(FidInputError, match=r"other settings \(first_seed=20; now first_seed=21\)"):
        _draw(model, tmp_path / "cut", jax.devices()[:1], first_seed=21).run()


def test_the_preview_is_the_first_seeds_images_the_detector_embedded(model, tmp_path):
    """``preview=5`` over 2 devices, 2 images each per step: the first chunk's two steps give
    seeds 20..24's images, tiled as every preview (``dew.tracking.render.image_pixels``)."""
    from PIL import Image

    from dew.artifacts import ImageGrid
    from dew.tracking.render import image_pixels

    sums = _completed(_draw(model, tmp_path, jax.devices()[:2], preview=5))
    assert sums.count == 11
    objective, params = model
    images = np.asarray(
        jax.jit(lambda p, s: fp.draw_images(objective, p, s, FEW_STEPS["cifar10"]))(
            params, jnp.arange(20, 25, dtype=jnp.int32)
        )
    )
    want = image_pixels(ImageGrid(images.astype(np.float32) / 127.5 - 1.0))
    with Image.open(tmp_path / fp.PREVIEW_FILE) as png:
        got = np.asarray(png)
    np.testing.assert_array_equal(got.reshape(want.shape), want)


def test_two_processes_each_draw_their_seed_share_and_get_the_one_process_sums(model, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "PYTHONPATH": root,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
    }
    outs = [tmp_path / f"process{i}.npz" for i in range(2)]
    helper = os.path.join(root, "tests", "helpers_fid_multiprocess.py")
    procs = [
        subprocess.Popen(
            [sys.executable, helper, str(i), str(port), str(tmp_path / "draw"), str(outs[i])],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=900)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{logs[i][-3000:]}"
    # the same per-device batch (2) on 4 devices of 2 processes as on 4 devices of this one
    single = _completed(_draw(model, tmp_path / "single", jax.devices()[:4]))
    for out in outs:
        with np.load(out) as got:
            assert int(got["count"]) == single.count == 11
            np.testing.assert_array_equal(got["total"], single.total)
            np.testing.assert_array_equal(got["outer"], single.outer)
    with np.load(tmp_path / "draw" / fp.PROGRESS_FILE) as progress:  # written once, by process 0
        assert int(progress["chunks_done"]) == 3
