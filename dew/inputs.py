"""What a model reads from a batch: the sample field and its conditions."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Field:
    """A batch field and its per-example shape: ``Field("image", (128, 128, 3))``."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Field.name must be non-empty")
        if any((not isinstance(d, int)) or d <= 0 for d in self.shape):
            raise ValueError(f"Field {self.name!r}: shape must be positive ints, got {self.shape}")


@dataclasses.dataclass(frozen=True)
class Condition:
    """Names one conditioning input: its encoder, the batch field holding its tokens, and the
    raw datum standing for "no condition" in the unconditional branch (used for condition
    dropout at training time and for classifier-free guidance at sampling time)."""

    encoder: str
    field: Field
    unconditional: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.encoder, str) or not self.encoder:
            raise ValueError(f"Condition.encoder must name an encoder in dew.encoders, got {self.encoder!r}")
        if not isinstance(self.field, Field):
            raise TypeError(
                f"Condition.field must be a Field, got {type(self.field).__name__} ({self.field!r})"
            )


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """Names the sample field and the conditions, keyed by the model keyword each is passed
    under: ``InputSpec(Field("image", (8, 8, 1)), {"label": Condition(...)})``."""

    sample: Field
    conditions: Mapping[str, Condition] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.sample, Field):
            raise TypeError(f"InputSpec.sample must be a Field, got {type(self.sample).__name__}")
        for key, condition in self.conditions.items():
            if not isinstance(condition, Condition):
                raise TypeError(f"InputSpec.conditions[{key!r}] must be a Condition, got {condition!r}")
        names = [f.name for f in self.fields()]
        if len(set(names)) != len(names):
            raise ValueError(f"InputSpec: batch field names must be distinct, got {names}")

    def fields(self) -> list[Field]:
        return [self.sample, *(c.field for c in self.conditions.values())]
