from __future__ import annotations

import pytest

from dew.registry import Registry, UnknownNameError


def test_unknown_name_lists_known_names_and_the_closest_match():
    table = Registry("models")
    table.register("unet", object())
    table.register("transformer", object())
    with pytest.raises(UnknownNameError) as info:
        table["unte"]
    message = str(info.value)
    assert "unknown models 'unte'" in message
    assert "['transformer', 'unet']" in message
    assert "did you mean 'unet'?" in message


def test_registering_a_name_twice_is_an_error():
    table = Registry("presets")
    table.register("EDM", 1)
    with pytest.raises(ValueError, match="'EDM' is already registered"):
        table.register("EDM", 2)
    assert table["EDM"] == 1


def test_decorator_form_and_attribute_access():
    table = Registry("samplers")

    @table.register("euler")
    def euler():
        return "e"

    assert table.euler is euler
    with pytest.raises(AttributeError, match="unknown samplers 'heun'"):
        table.heun  # noqa: B018


def test_real_registries_hold_the_built_components():
    import dew

    assert dew.presets.EDM.sigma_max == 80.0
    assert {"euler", "heun"} <= set(dew.samplers.names())
    assert "digits" in dew.datasets
    assert "class_label" in dew.encoders
    assert "diffusion" in dew.registry.objectives
    with pytest.raises(UnknownNameError, match="did you mean 'digits'"):
        dew.datasets["digit"]
