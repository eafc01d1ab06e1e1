"""Named registries: the one place a config string becomes a component.

The registries start empty. The entry layer (``dew/__init__``) installs a *filler* that imports
the modality modules, which register themselves; the filler runs the first time any registry is
read, so ``import dew`` and ``import dew.training`` never pay for (or depend on) modalities.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, Literal, TypeVar

T = TypeVar("T")

_filler: Callable[[], None] | None = None
_filling = False
_filled = False


def set_filler(fill: Callable[[], None]) -> None:
    """Install the function that populates every registry on first read (entry layer only)."""
    global _filler
    _filler = fill


def _ensure_filled() -> None:
    global _filling, _filled
    if _filled or _filling or _filler is None:
        return
    _filling = True
    try:
        _filler()
        _filled = True
    finally:
        _filling = False


class UnknownNameError(KeyError):
    """A registry lookup missed; the message lists what exists and the closest match."""

    def __str__(self) -> str:  # KeyError would repr() the message and quote it.
        return str(self.args[0])


class Registry(Generic[T]):
    """A name -> component table that refuses duplicates and explains misses.

    Lookups work by item (``models["unet"]``) and by attribute (``presets.EDM``), so presets read
    like constants in user code while configs can still name them as strings.
    """

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._entries: dict[str, T] = {}

    @property
    def kind(self) -> str:
        return self._kind

    def register(self, name: str, value: T | None = None):
        """Add ``name``; usable directly or as a decorator. A second registration is an error."""

        def add(item: T) -> T:
            if not isinstance(name, str) or not name:
                raise ValueError(f"{self._kind} registry: name must be a non-empty str, got {name!r}")
            if name in self._entries:
                raise ValueError(
                    f"{self._kind} registry: {name!r} is already registered "
                    f"(to {self._entries[name]!r}); pick another name"
                )
            self._entries[name] = item
            return item

        return add if value is None else add(value)

    def names(self) -> list[str]:
        _ensure_filled()
        return sorted(self._entries)

    def __getitem__(self, name: str) -> T:
        _ensure_filled()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self._miss_message(name)) from None

    def __getattr__(self, name: str) -> T:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except UnknownNameError as e:
            raise AttributeError(str(e)) from None

    def __contains__(self, name: object) -> bool:
        _ensure_filled()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        _ensure_filled()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self._kind!r}, {sorted(self._entries)})"

    def _miss_message(self, name: object) -> str:
        known = sorted(self._entries)
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.0) if known else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown {self._kind} {name!r}: registered {self._kind} are {known}{hint}"


def _ready() -> None:
    """Nothing to check: the metric needs nothing beyond its images."""


@dataclasses.dataclass(frozen=True)
class Metric:
    """A registered metric with what its readers ask of it: calling it calls ``score`` (with the
    images, and the labels they were asked for where the objective has them); ``check_ready()``
    raises ``OSError`` / ``ValueError`` saying what to set when it could not score (weights or
    reference statistics missing), before any work; ``goal`` is which way is better (``dew.sweep``).
    A plain function registered in ``metrics`` reads as ``Metric(fn)`` (``as_metric``)."""

    score: Callable[..., float]
    check_ready: Callable[[], None] = _ready
    goal: Literal["min", "max"] = "min"

    def __call__(self, *args: Any, **kwargs: Any) -> float:
        return self.score(*args, **kwargs)


def as_metric(component: Callable[..., float]) -> Metric:
    """A ``metrics`` entry as a ``Metric``: itself, or a plain function with the defaults."""
    return component if isinstance(component, Metric) else Metric(component)


# A component is whatever its module registered under the name (a class, a function, a preset):
# known only when the name is looked up, so a lookup is Any and the caller checks what it got
# (``dew.training.build.build_objective``: an Objective; ``as_metric``: a Metric).
datasets: Registry[Any] = Registry("datasets")
encoders: Registry[Any] = Registry("encoders")
metrics: Registry[Any] = Registry("metrics")
models: Registry[Any] = Registry("models")
presets: Registry[Any] = Registry("presets")
samplers: Registry[Any] = Registry("samplers")
objectives: Registry[Any] = Registry("objectives")

__all__ = [
    "Metric",
    "Registry",
    "UnknownNameError",
    "as_metric",
    "datasets",
    "encoders",
    "metrics",
    "models",
    "objectives",
    "presets",
    "samplers",
    "set_filler",
]
