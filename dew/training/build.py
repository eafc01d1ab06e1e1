"""Building the pieces a run config names: the mesh and layout with the data streams they feed
(per-process batches), the objective, and the checks of the config's cadences against them.
Each turns a problem the user can fix into a ``ConfigError`` naming the config field."""

from __future__ import annotations

import sys
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


def mesh_and_data(
    config: ml_collections.ConfigDict, train_source: Any, val_source: Any
) -> tuple[Mesh, Layout, Dataset, Dataset]:
    """The mesh ``config.mesh`` asks for (over ``config.mesh.devices`` devices, 0: all, the same
    number from every process of a multi-process run), its layout, and the streams it feeds:
    this process's share of the training split (shuffled, ``config.dataset.batch_size``) and of
    the validation split (in order, ``config.eval.batch_size`` when set). A global batch the
    mesh's data-parallel axes or the process count do not divide, a split that cannot hold its
    batch, and (evaluation on) ``config.eval.num_batches`` batches the validation split cannot
    hold are each a ``ConfigError`` naming the field."""
    devices = distributed.mesh_devices(config.mesh.devices)  # a count the processes do not divide: named
    try:
        mesh = sharding.spec_from_config(config.mesh).mesh(devices)
        layout = Layout.for_mesh(mesh)
    except ValueError as e:
        raise ConfigError(f"config.mesh / config.dataset.batch_size: {e}") from e
    share = DataPartition(jax.process_index(), jax.process_count())
    sizes = {"dataset.batch_size": config.dataset.batch_size}  # global batches, by their config field
    if config.eval.batch_size is not None:
        sizes["eval.batch_size"] = config.eval.batch_size
    for field, size in sizes.items():
        try:
            layout.check_batch(size, f"config.{field}")
        except ValueError as e:
            raise ConfigError(f"config.mesh / config.{field}: {e}") from e
        if size % share.count:
            raise ConfigError(
                f"config.{field}={size} is invalid: expected a multiple of the "
                f"{share.count} processes (each reads an equal share)"
            )
    hint = "" if len(sizes) > 1 else " (set config.eval.batch_size for a smaller validation batch)"
    streams: list[Dataset] = []
    for source, field, shuffle, tail in (
        (train_source, "dataset.batch_size", True, ""),
        (val_source, list(sizes)[-1], False, hint),
    ):
        try:
            streams.append(
                Dataset(source, sizes[field] // share.count, seed=config.seed, share=share, shuffle=shuffle)
            )
        except ValueError as e:
            raise ConfigError(f"config.{field}={sizes[field]} is invalid: {e}{tail}") from None
    train, val = streams
    if config.eval.every:
        try:  # fail now, not at the first evaluation
            val.first(config.eval.num_batches)
        except ValueError as e:
            raise ConfigError(f"config.eval.num_batches={config.eval.num_batches} is invalid: {e}") from None
    return mesh, layout, train, val


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


def check_cadences(config: ml_collections.ConfigDict, objective: Objective) -> None:
    """What ``config.preview`` and ``config.checkpoint`` ask of the built objective and the
    evaluation: previews need an objective that has one, and every ``preview.metrics`` name
    must be one the objective scores and ready to score (e.g. fid's reference statistics and
    weights present), else a ``ConfigError``; a best checkpoint ranked by a loss no evaluation
    computes is a warning on stderr."""
    if config.preview.every and not objective.has_preview:
        raise ConfigError(
            f"config.preview.every={config.preview.every} is invalid: {type(objective).__name__} has no "
            "preview; expected 0"
        )
    if config.preview.metrics:  # score(None, ...) checks the names without scoring anything
        metrics = {name: registry.metrics[name] for name in config.preview.metrics}
        objective.score(None, metrics)
        for name, metric in metrics.items():
            try:
                registry.as_metric(metric).check_ready()
            except (OSError, ValueError) as e:
                raise ConfigError(f"config.preview.metrics: {name!r} cannot be scored: {e}") from None
    checkpoint = config.checkpoint
    if (
        not config.eval.every
        and checkpoint.keep_best
        and checkpoint.best_metric == "loss"
        and checkpoint.every
    ):
        print(
            "warning: config.checkpoint.keep_best=True but config.eval.every=0: without evaluation "
            "there is no loss to rank checkpoints by, so no best checkpoint is kept",
            file=sys.stderr,
            flush=True,
        )


__all__ = ["build_objective", "check_cadences", "mesh_and_data", "open_split"]
