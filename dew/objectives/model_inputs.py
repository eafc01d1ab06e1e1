"""The network an objective calls and what it feeds it, read from a run config: the registered
network ``config.model`` names, refused unless its ``__call__`` takes the arguments the objective
passes (``network_factory``, ``takes_arguments``), how it takes classes (``label_input``: DiT's
int ``y`` or the class encoder's ``label``), the class conditions ``config.objective.condition``
asks of the data (``class_conditions``) and the field it samples, in pixels or a VAE's latents
(``sample_field``). Shared by ``meanflow``, ``imeanflow``, ``interpolant`` and ``iddpm``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from dew import registry
from dew.encoding.class_label import UNCONDITIONAL
from dew.inputs import Condition, Field
from dew.objectives import latent_space
from dew.schema import ConfigError

ModuleFactory = Callable[[], Any]  # a registered network's constructor (a haiku module)


def takes_arguments(factory: Any, names: tuple[str, ...]) -> bool:
    """Whether the network ``factory`` builds is called with each of ``names`` (its ``__call__``
    declares them by name)."""
    target = factory.func if isinstance(factory, functools.partial) else factory
    call = target.__call__ if isinstance(target, type) else target
    try:
        parameters = inspect.signature(call).parameters
    except (TypeError, ValueError):
        return False
    return all(n in parameters for n in names)


def label_input(factory: Any) -> str:
    """How the network takes classes: ``"y"`` (int labels, positional, as DiT) when its
    ``__call__`` names ``y``, else ``"label"`` (the class encoder's vector, by keyword)."""
    return "y" if takes_arguments(factory, ("y",)) else "label"


def check_label_input(label_input: str) -> None:
    """``ValueError`` unless ``label_input`` is one of the two ways a network takes classes."""
    if label_input not in ("label", "y"):
        raise ValueError(f"label_input={label_input!r} is invalid: expected 'label' or 'y'")


def _constructor_takes(factory: Any, name: str) -> bool:
    target = factory.func if isinstance(factory, functools.partial) else factory
    try:
        return name in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def network_factory(config: Any, objective: str, arguments: tuple[str, ...]) -> ModuleFactory:
    """``config.model``'s registered network as a factory, refused (``ConfigError``) unless its
    ``__call__`` takes ``arguments`` (e.g. MeanFlow's second time input ``h``) and, for a network
    that builds its time inputs on request (``time_inputs``, DiT), it is asked for ``h``."""
    name = config.model.name
    if name is None:
        raise ConfigError(
            f"config.model.name=None is invalid: the {objective} objective needs a network taking "
            f"({', '.join(('x', 't', *arguments))}), one of {registry.models.names()}"
        )
    component = registry.models[name]
    if not takes_arguments(component, arguments):
        raise ConfigError(
            f"config.model.name={name!r} is invalid: the {objective} objective calls its network "
            f"with {', '.join(arguments)} (net(x, t, {', '.join(arguments)}, ...)), which {name} does "
            "not take; expected a network that does (e.g. unet, or an MF-/iMF- DiT)"
        )
    options = {k: v for k, v in config.model.items() if k != "name"}
    if _constructor_takes(component, "time_inputs"):
        preset = component.keywords if isinstance(component, functools.partial) else {}
        built = options.get("time_inputs", preset.get("time_inputs", ()))
        if "h" not in tuple(built or ()):
            raise ConfigError(
                f"config.model.time_inputs={tuple(built or ())!r} is invalid: the {objective} objective "
                f"feeds {name} a second time input h; expected ('t', 'h') (or ('h',) in context)"
            )
    return functools.partial(component, **options)


def class_conditions(config: Any, source: Any, needs_classes: bool, objective: str):
    """(conditions, encoder factory or None, num_classes or None) for ``config.objective.condition``;
    a ``ConfigError`` when guidance or class dropout is asked of data without classes."""
    choice = config.objective.condition
    if choice == "auto":
        choice = "class_label" if source.num_classes else "none"
    if choice == "class_label" and not source.num_classes:
        raise ConfigError(f"config.objective.condition='class_label': {source.name} has no classes")
    if choice == "none" and needs_classes:
        raise ConfigError(
            f"config.objective (name={objective!r}): guidance or class dropout is set but the model is "
            f"not class-conditional ({source.name} has no classes, or condition='none'); expected "
            "guidance_eq='none' and class_dropout_prob=0 for unconditional training"
        )
    if choice == "none":
        return {}, None, None
    conditions = {"label": Condition("class_label", Field("label", (), "int32"), UNCONDITIONAL)}
    encoder = functools.partial(registry.encoders["class_label"], source.num_classes)
    return conditions, encoder, int(source.num_classes)


def sample_field(config: Any, source: Any) -> tuple[Field, Any, tuple[int, ...] | None]:
    """(the model's sample field, the latent space or None, the decoded image shape or None)."""
    column = source.fields[source.sample_field]
    latent = latent_space.from_config(
        config.objective.get("latent"), latent_space.decodes_while_training(config)
    )
    shape = tuple(column.shape[1:])
    if latent is None:
        return Field(source.sample_field, shape), None, None
    model_shape = latent.sample_shape(shape)
    return Field(source.sample_field, model_shape), latent, latent.image_shape(model_shape)
