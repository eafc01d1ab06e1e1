"""The digits race's shared sampling noise (``experiments/race_latents.py``): dew's race
(``experiments/digits_race.py``) and the reference's (``third_party/edm/digits_race_reference.py``)
must start their samplers from the same latents and labels for the same seeds. The reference's
builder is pure NumPy, so it is checked here without PyTorch."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import numpy as np
import pytest

from dew.sampling.solvers import check_unit_noise

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shared = load(ROOT / "experiments" / "race_latents.py")
dew_race = load(ROOT / "experiments" / "digits_race.py")
reference_race = load(ROOT / "third_party" / "edm" / "digits_race_reference.py")


@pytest.mark.parametrize("per_class", [1, 20])
def test_both_races_sample_the_same_latents_and_labels(per_class: int) -> None:
    seeds = [1, 2, 3]
    given = reference_race.sampling_inputs(seeds, per_class)  # what the PyTorch trainer samples
    assert given["latents"].shape == (3, 10 * per_class, 1, 8, 8)
    assert given["latents"].dtype == np.float32
    np.testing.assert_array_equal(given["sample_seeds"], seeds)
    for i, seed in enumerate(seeds):
        noise, labels = dew_race.load_race_latents().race_latents(seed, per_class, (8, 8, 1))
        # exactly equal: the same bits start both samplers (NCHW on the reference's side)
        np.testing.assert_array_equal(given["latents"][i].transpose(0, 2, 3, 1), noise)
        np.testing.assert_array_equal(given["labels"], labels)
    # class-major, as Diffusion.draw and torch.arange(10).repeat_interleave(per_class) order them
    np.testing.assert_array_equal(given["labels"], np.arange(10).repeat(per_class))


def test_latents_are_one_seeded_unit_normal_draw() -> None:
    noise, labels = shared.race_latents(1, 20)
    assert noise.shape == (200, 8, 8, 1) and noise.dtype == np.float32 and labels.dtype == np.int32
    # NumPy's PCG64 stream for seed 1: a change here changes every recorded race's noise
    np.testing.assert_array_equal(
        noise.ravel()[:4], np.array([1.7291036, -1.4284534, 1.0277448, 1.8820691], np.float32)
    )
    again, _ = shared.race_latents(1, 20)
    np.testing.assert_array_equal(again, noise)
    other, _ = shared.race_latents(2, 20)
    assert not np.array_equal(other, noise)
    for seed in (1, 2, 3):  # unscaled: each sampler multiplies by its σ_max itself
        check_unit_noise(shared.race_latents(seed, 20)[0])


def test_seed_lists_are_checked() -> None:
    assert shared.parse_seeds("1,2,3") == [1, 2, 3]
    assert shared.parse_seeds("7") == [7]
    for bad in ("", "1,x", "1,1", "-1", "1,,2"):
        with pytest.raises(ValueError, match="--sample_seeds"):
            shared.parse_seeds(bad)
    with pytest.raises(ValueError, match="seed -1"):
        shared.race_latents(-1, 20)
    with pytest.raises(ValueError, match="per_class 0"):
        shared.race_latents(1, 0)
