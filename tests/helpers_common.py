"""What many test files share: the repository root and a tiny training config.

Test files import it as ``from helpers_common import ROOT, tiny_config`` (``tests/`` is on
``sys.path``: pytest's ``pythonpath`` setting in pyproject.toml, and a script's own folder when a
test starts a helper as a child process). Importing it starts nothing and sets no environment;
tests/conftest.py does the suite's set-up.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax
    from numpy.typing import ArrayLike

#: The repository's root folder (the parent of ``tests/``).
ROOT = pathlib.Path(__file__).resolve().parent.parent


def device_batch(batch: Mapping[str, ArrayLike]) -> dict[str, jax.Array]:
    """A host batch (numpy arrays, as a data source yields it) as an objective's pure functions
    take it: a ``Batch`` of jax arrays, converted as a jitted call converts its numpy arguments."""
    import jax.numpy as jnp

    return {name: jnp.asarray(value) for name, value in batch.items()}


def tiny_config(**overrides):
    """experiments/edm.py shrunk so a test compiles and trains in seconds; ``overrides`` maps
    dotted config fields to values (strings are applied as written, others by ``repr``)."""
    from dew.config import apply_overrides, load_config

    config = load_config(str(ROOT / "experiments" / "edm.py"))
    defaults = {
        "dataset.batch_size": 16,
        "model.model_channels": 8,
        "model.num_blocks": 1,
        # One resolution level, no attention: half the compile of two levels with attention.
        "model.channel_mult": (1,),
        "model.attn_resolutions": (),
        "train.num_steps": 6,
        "train.log_every": 2,
        "checkpoint.every": 3,
        "eval.every": 3,
        "eval.num_batches": 1,
        "preview.every": 3,
        "objective.sampling.steps": 3,
        "objective.sampling.per_class": 2,
        "optimizer.warmup_steps": 2,
        # One device unless a test asks for a mesh: eight virtual devices on two cores make every
        # step a cross-thread all-reduce, slow and (under load) prone to XLA's rendezvous timeout.
        "mesh.devices": 1,
    }
    defaults.update(overrides)
    return apply_overrides(
        config,
        [f"config.{k}={v!r}" if not isinstance(v, str) else f"config.{k}={v}" for k, v in defaults.items()],
    )
