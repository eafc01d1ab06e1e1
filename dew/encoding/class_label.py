"""Class labels as a learned embedding; label -1 is the "no label" of the unconditional branch."""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry

UNCONDITIONAL = -1
"""The label value that encodes to the zero vector (EDM's unconditional class input)."""


class ClassLabel(hk.Module):
    """One-hot labels, as EDM feeds them to ``map_label``: [B] int -> [B, num_classes].

    A label of -1 one-hots to all zeros, so dropping a label (for classifier-free guidance)
    needs no extra class and the model's label projection sees exactly nothing.
    """

    def __init__(self, num_classes: int, name: str | None = None):
        super().__init__(name=name)
        if num_classes < 1:
            raise ValueError(f"ClassLabel: num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes

    @staticmethod
    def tokens(datum: Any, shape: tuple[int, ...] = ()) -> np.ndarray:
        """The batch-field value of one raw label (an int; ``None`` is the unconditional -1)."""
        if shape != ():
            raise ValueError(f"ClassLabel: the label field holds scalars, got a field shape {shape}")
        return np.asarray(UNCONDITIONAL if datum is None else int(datum), np.int32)

    def __call__(self, labels: jax.Array) -> jax.Array:
        if not jnp.issubdtype(labels.dtype, jnp.integer):
            raise TypeError(f"ClassLabel: labels must be integers, got dtype {labels.dtype}")
        return jax.nn.one_hot(labels, self.num_classes, dtype=jnp.float32)


registry.encoders.register("class_label", ClassLabel)
