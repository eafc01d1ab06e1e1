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


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """Names the sample field and the conditions, keyed by the model keyword each is passed
    under: ``InputSpec(Field("image", (8, 8, 1)), {"label": Condition(...)})``."""

    sample: Field
    conditions: Mapping[str, Condition] = dataclasses.field(default_factory=dict)

    def fields(self) -> list[Field]:
        return [self.sample, *(c.field for c in self.conditions.values())]
