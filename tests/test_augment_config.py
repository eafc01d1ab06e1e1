"""``config.objective.augment``: keyed exactly as NVlabs/edm's ``AugmentPipe`` constructor, with its
defaults (``p`` = 0: off), and one line naming the field, value and accepted range for bad input."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest
from helpers_common import ROOT

from dew.augment.settings import AugmentSettings
from dew.config import ConfigError, apply_overrides, load_config

EDM = str(ROOT / "experiments" / "edm.py")
REFERENCE = pathlib.Path("/work/ref/edm/training/augment.py")


def _reference_constructor_defaults() -> dict[str, float]:
    """``AugmentPipe.__init__``'s keywords and defaults, read from the reference's source."""
    tree = ast.parse(REFERENCE.read_text())
    pipe = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "AugmentPipe")
    init = next(n for n in pipe.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    args = init.args.args[1:]
    defaults = init.args.defaults
    return {a.arg: float(ast.literal_eval(d)) for a, d in zip(args, defaults, strict=True)}


# The reference's constructor, written out (so the test runs without the reference checkout too).
REFERENCE_DEFAULTS = {
    "p": 1.0,
    "xflip": 0.0,
    "yflip": 0.0,
    "rotate_int": 0.0,
    "translate_int": 0.0,
    "translate_int_max": 0.125,
    "scale": 0.0,
    "rotate_frac": 0.0,
    "aniso": 0.0,
    "translate_frac": 0.0,
    "scale_std": 0.2,
    "rotate_frac_max": 1.0,
    "aniso_std": 0.2,
    "aniso_rotate_prob": 0.5,
    "translate_frac_std": 0.125,
    "brightness": 0.0,
    "contrast": 0.0,
    "lumaflip": 0.0,
    "hue": 0.0,
    "saturation": 0.0,
    "brightness_std": 0.2,
    "contrast_std": 0.5,
    "hue_max": 1.0,
    "saturation_std": 1.0,
}


@pytest.mark.skipif(not REFERENCE.exists(), reason="the NVlabs/edm checkout is not on this machine")
def test_the_written_out_defaults_are_the_reference_constructor_s():
    assert _reference_constructor_defaults() == REFERENCE_DEFAULTS


def test_keys_and_defaults_are_the_reference_constructor_s_but_p_is_off():
    config = apply_overrides(load_config(EDM), [])
    augment = config.objective.augment.to_dict()
    assert sorted(augment) == sorted(REFERENCE_DEFAULTS)  # the names (a ConfigDict sorts them)
    fields = [f.name for f in dataclasses.fields(AugmentSettings)]
    assert fields == list(REFERENCE_DEFAULTS)  # the settings keep the constructor's order
    assert augment == {**REFERENCE_DEFAULTS, "p": 0.0}  # p = 0: train.py --augment=0, no pipe
    settings = AugmentSettings.from_config(config.objective.augment)
    assert not settings.enabled and settings.label_dim == 0


def test_the_paper_setting_reads_and_needs_nine_labels():
    paper = ["p=0.12", "xflip=1e8", "yflip=1", "scale=1", "rotate_frac=1", "aniso=1", "translate_frac=1"]
    config = apply_overrides(load_config(EDM), [f"config.objective.augment.{kv}" for kv in paper])
    settings = AugmentSettings.from_config(config.objective.augment)
    assert settings.p == 0.12 and settings.xflip == 1e8 and settings.translate_frac == 1.0
    assert settings.label_dim == 9  # train.py: network_kwargs.augment_dim = 9


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("p=1.5", r"^config.objective.augment.p=1.5 is invalid: expected a float in \[0, 1\]$"),
        ("p=-0.1", r"^config.objective.augment.p=-0.1 is invalid: expected a float in \[0, 1\]$"),
        ("xflip=-1", r"^config.objective.augment.xflip=-1.0 is invalid: expected a float >= 0"),
        ("scale_std=nan", r"^config.objective.augment.scale_std=nan is invalid: expected a float >= 0$"),
        ("translate_int_max=0", r"translate_int_max=0.0 is invalid: expected a float in \(0, 1\]$"),
        ("aniso_rotate_prob=2", r"aniso_rotate_prob=2.0 is invalid: expected a float in \[0, 1\]$"),
        ("p=often", r"^config.objective.augment.p='often': expected a float"),
        ("xflips=1", r"unknown config key 'config.objective.augment.xflips'.*did you mean 'xflip'"),
    ],
)
def test_bad_values_are_one_line_naming_field_value_and_range(override, message):
    with pytest.raises(ConfigError, match=message) as caught:
        apply_overrides(load_config(EDM), [f"config.objective.augment.{override}"])
    assert "\n" not in str(caught.value)


def test_settings_built_in_code_are_checked_the_same_way():
    with pytest.raises(ConfigError, match=r"^config.objective.augment.hue_max=-1.0 is invalid"):
        AugmentSettings(hue_max=-1.0)
