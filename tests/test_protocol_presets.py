"""The FID protocol's presets for DiT's, SiT's and REPA's objectives
(``dew.objectives.protocol_presets``): each is the sampling its experiment records for the
published FID, and a preset of another objective than the run's is refused in one line naming
both."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from helpers_common import ROOT, tiny_config

from dew.config import apply_overrides, load_config
from dew.objectives import protocol_presets as pp
from dew.scoring import fid_protocol as fp
from dew.scoring.fid_reference import FidInputError
from dew.training.build import build_objective, open_split
from dew.training.trainer_config import resolve_config


def resolved(experiment: str, name: str):
    return resolve_config(apply_overrides(load_config(f"{ROOT / 'experiments' / experiment}:{name}"), []))


def objective_of(config):
    return build_objective(config, open_split(config.dataset, "train"))


def test_presets_are_the_experiments_fid_sampling():
    dit = resolved("dit.py", "DiT-XL/2").objective.sampling
    assert (dit.method, dit.steps, dit.cfg_scale, dit.cfg_channels) == ("ddpm", 250, 1.5, 3)
    assert pp.OBJECTIVE_PRESETS["dit"] == pp.ObjectivePreset(
        "dit", "iddpm", "ddpm", dit.steps, dit.cfg_scale, dit.cfg_channels
    )
    for name, experiment in (("sit", "sit.py"), ("repa", "repa.py")):
        s = resolved(experiment, "SiT-XL/2").objective.sampling
        preset = pp.OBJECTIVE_PRESETS[name]
        rounding = {"sit": "half_up", "repa": "truncate"}[name]
        assert preset == pp.ObjectivePreset(
            name,
            "interpolant",
            s.sampler,
            s.steps,
            s.cfg_scale,
            s.cfg_channels,
            tuple(s.guidance_interval),
            rounding,
        )
    assert pp.OBJECTIVE_PRESETS["sit"].settings() == {
        "preset": "sit",
        "objective": "interpolant",
        "sampler": "transport_sde",
        "steps": 250,
        "cfg_scale": 1.5,
        "cfg_channels": 3,
        "guidance_interval": [0.0, 1.0],
        "uint8": "clamp(127.5 * x + 128, 0, 255) truncated",
    }
    assert pp.OBJECTIVE_PRESETS["repa"].settings()["guidance_interval"] == [1.0 - 0.7, 1.0]
    assert "guidance_interval" not in pp.OBJECTIVE_PRESETS["dit"].settings()


def test_a_preset_resolves_for_its_own_objective_and_is_refused_for_another():
    sit = objective_of(resolve_config(load_config(f"{ROOT / 'experiments' / 'sit.py'}:digits")))
    dit = objective_of(resolve_config(load_config(f"{ROOT / 'experiments' / 'dit.py'}:digits")))
    edm = objective_of(resolve_config(tiny_config()))
    assert (pp.objective_name(sit), pp.objective_name(dit)) == ("interpolant", "iddpm")
    assert pp.resolve("sit", sit) is pp.OBJECTIVE_PRESETS["sit"]
    assert pp.resolve("repa", sit) is pp.OBJECTIVE_PRESETS["repa"]
    assert pp.resolve("dit", dit) is pp.OBJECTIVE_PRESETS["dit"]
    assert pp.resolve("cifar10", edm) is fp.PRESETS["cifar10"]
    with pytest.raises(FidInputError) as e:
        pp.resolve("dit", sit)
    assert str(e.value) == (
        "--preset='dit' draws 'iddpm' runs, but --workdir is a 'interpolant' run; "
        "expected one of its presets ['repa', 'sit']"
    )
    with pytest.raises(FidInputError, match=r"^--preset='sit' draws 'interpolant' runs, but --workdir is a "):
        pp.resolve("sit", dit)
    with pytest.raises(
        FidInputError, match=r"^--preset='cifar10' draws 'EDM σ-sampler' runs, .* 'iddpm' run"
    ):
        pp.resolve("cifar10", dit)
    with pytest.raises(FidInputError, match=r"^--preset='repa' draws 'interpolant' runs, .* \['afhqv2', "):
        pp.resolve("repa", edm)
    with pytest.raises(FidInputError, match=r"^--preset='sdxl' is not a sampler preset; expected one of"):
        pp.preset_named("sdxl")
    assert str(e.value).count("\n") == 0


def test_pixel_samples_become_uint8_as_each_reference_writes_its_pngs():
    """DiT's and SiT's sample_ddp.py: clamp(127.5 x + 128, 0, 255) truncated; REPA's generate.py:
    clamp(255 (x + 1) / 2, 0, 255) truncated (values exact in float32 away from the cut)."""
    x = np.array([-1.5, -1.0, -0.003, 0.0, 0.999, 1.2], np.float32)
    pixel_run = SimpleNamespace(latent=None)
    half_up = np.asarray(pp.OBJECTIVE_PRESETS["sit"].to_uint8(pixel_run, x))
    np.testing.assert_array_equal(half_up, [0, 0, 127, 128, 255, 255])
    np.testing.assert_array_equal(np.asarray(pp.OBJECTIVE_PRESETS["dit"].to_uint8(pixel_run, x)), half_up)
    truncate = np.asarray(pp.OBJECTIVE_PRESETS["repa"].to_uint8(pixel_run, x))
    np.testing.assert_array_equal(truncate, [0, 0, 127, 127, 254, 255])
    assert half_up.dtype == truncate.dtype == np.uint8
