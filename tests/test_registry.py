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


def test_a_metric_carries_its_readiness_check_and_goal_as_typed_fields():
    """Readers take ``check_ready`` and ``goal`` from ``Metric``; a plain function reads as the
    defaults (nothing to check, lower is better), and calling either scores."""
    from dew.registry import Metric, as_metric

    def brightness(images, labels=None) -> float:
        return float(sum(images))

    plain = as_metric(brightness)
    assert plain.goal == "min" and plain.check_ready() is None and plain([1.0, 2.0]) == 3.0

    def not_ready() -> None:
        raise FileNotFoundError("set $REF")

    declared = Metric(brightness, not_ready, goal="max")
    assert as_metric(declared) is declared and declared([2.0], None) == 2.0
    with pytest.raises(FileNotFoundError, match=r"set \$REF"):
        declared.check_ready()
    with pytest.raises(AttributeError):  # frozen: a reader cannot change what was registered
        declared.goal = "min"  # type: ignore[misc]


def test_registered_metrics_and_sources_declare_through_the_typed_records():
    import dew
    from dew.registry import Metric
    from dew.schema import Declared, section_from_signature

    assert dew.metrics["digits_class_accuracy"].goal == "max"
    assert isinstance(dew.metrics["fid"], Metric) and isinstance(dew.metrics["fd_dinov2"], Metric)
    for name in ("image_folder", "latent_dataset"):
        component = dew.datasets[name]
        assert isinstance(component, Declared)
        section = section_from_signature(component, "the source's options")
        assert section.doc == component.section().doc and "use_labels" in section.keys
