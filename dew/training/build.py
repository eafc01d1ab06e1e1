"""Building the pieces a run config names: the mesh and layout, the data splits with their
per-process batches, the objective. Each turns a problem the user can fix into a
``ConfigError`` naming the config field."""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh

from dew import registry
from dew.contracts.objective import Objective
from dew.data.dataset import DataPartition, Dataset
from dew.data.splits import open_split
from dew.runtime import distributed
from dew.schema import ConfigError
from dew.training import sharding
from dew.training.sharding import Layout


def mesh_and_layout(config: ml_collections.ConfigDict) -> tuple[Mesh, Layout]:
    """The mesh ``config.mesh`` asks for, and its layout: over ``config.mesh.devices`` devices
    (0: all), the same number from every process of a multi-process run."""
    devices = distributed.mesh_devices(config.mesh.devices)  # a count the processes do not divide: named
    try:
        mesh = sharding.spec_from_config(config.mesh).mesh(devices)
        return mesh, Layout.for_mesh(mesh)
    except ValueError as e:
        raise ConfigError(f"config.mesh / config.dataset.batch_size: {e}") from e


def local_batch(layout: Layout, share: DataPartition, size: int, field: str) -> int:
    """This process's share of a global batch of ``size`` (``config.<field>``); a size the mesh's
    data-parallel axes or the process count do not divide is a ``ConfigError`` naming the field."""
    try:
        layout.check_batch(size, f"config.{field}")
    except ValueError as e:
        raise ConfigError(f"config.mesh / config.{field}: {e}") from e
    if size % share.count:
        raise ConfigError(
            f"config.{field}={size} is invalid: expected a multiple of the "
            f"{share.count} processes (each reads an equal share)"
        )
    return size // share.count


def datasets(
    config: ml_collections.ConfigDict, layout: Layout, train_source: Any, val_source: Any
) -> tuple[Dataset, Dataset]:
    """This process's training stream (shuffled) and validation stream (in order), each of its
    share of the global batch (``config.dataset.batch_size``; ``config.eval.batch_size`` for
    validation when set)."""
    share = DataPartition(jax.process_index(), jax.process_count())
    train_batch = local_batch(layout, share, config.dataset.batch_size, "dataset.batch_size")
    if config.eval.batch_size is None:
        eval_field, eval_batch = "dataset.batch_size", train_batch
        hint = " (set config.eval.batch_size for a smaller validation batch)"
    else:
        eval_field, hint = "eval.batch_size", ""
        eval_batch = local_batch(layout, share, config.eval.batch_size, eval_field)
    train = _dataset(train_source, train_batch, config, share, shuffle=True, field="dataset.batch_size")
    val = _dataset(val_source, eval_batch, config, share, shuffle=False, field=eval_field, hint=hint)
    return train, val


def _dataset(
    source: Any,
    batch: int,
    config: ml_collections.ConfigDict,
    share: DataPartition,
    *,
    shuffle: bool,
    field: str,
    hint: str = "",
) -> Dataset:
    try:
        return Dataset(source, batch, seed=config.seed, share=share, shuffle=shuffle)
    except ValueError as e:
        raise ConfigError(f"config.{field}={batch * share.count} is invalid: {e}{hint}") from None


def build_objective(config: ml_collections.ConfigDict, source: Any) -> Objective:
    """``config.objective.name``'s objective, built by its ``from_config``; a ValueError it raises
    about the config becomes a ``ConfigError``."""
    component = registry.objectives[config.objective.name]
    try:
        objective = component.from_config(config, source)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"config.objective (name={config.objective.name!r}): {e}") from None
    if not isinstance(objective, Objective):
        raise TypeError(f"{component!r}.from_config returned {type(objective).__name__}, not an Objective")
    return objective


__all__ = ["build_objective", "datasets", "local_batch", "mesh_and_layout", "open_split"]
