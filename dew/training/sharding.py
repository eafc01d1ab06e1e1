"""Placement of a train state and its batches on a device mesh (``MeshSpec``, ``Layout``).

The mesh has a data axis first, then one axis per sharding axis a ``MeshSpec`` names. A
``Layout`` gives every state leaf a ``NamedSharding`` by rule (replicated, or one dimension split
over a model/fsdp axis) and every batch a sharding over the data-parallel axes; the jitted step
then takes and returns sharded arrays with explicit in/out shardings and a donated state, so
nothing crosses to the host between steps except the batch coming in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dew.pytrees import leaf_path
from dew.schema import Key, Section, at_least
from dew.training import typed_jax

Rule = Callable[[str, tuple[int, ...]], PartitionSpec]
DATA = "data"


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Says how many devices each sharding axis takes; data parallelism fills the rest.

    ``axes`` maps a sharding axis name to its size, e.g. ``{"model": 2}`` on 8 devices is a 4x2
    mesh (data 4, model 2). ``devices`` uses only the first that many devices (``None``: all of
    them, across every process). Axis types are ``Auto``: haiku's convolutions do not accept
    explicit-axis meshes (see STACK.md).
    """

    axes: Mapping[str, int] = dataclasses.field(default_factory=dict[str, int])
    devices: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", dict(self.axes))
        for name, size in self.axes.items():
            if name == DATA:
                raise ValueError(
                    f"MeshSpec: {DATA!r} is not a sharding axis; data parallelism fills the rest"
                )
            if not isinstance(size, int) or size < 1:  # pyright: ignore[reportUnnecessaryIsInstance] (any caller)
                raise ValueError(f"MeshSpec: axis {name!r} must take an int >= 1 devices, got {size!r}")
        if self.devices is not None and (
            not isinstance(self.devices, int)  # pyright: ignore[reportUnnecessaryIsInstance] (any caller)
            or self.devices < 1
        ):
            raise ValueError(f"MeshSpec.devices must be an int >= 1 or None (all), got {self.devices!r}")

    def shape(self, num_devices: int) -> dict[str, int]:
        """The full mesh shape on ``num_devices`` devices: data first, then the sharding axes."""
        sharded = math.prod(self.axes.values())
        if num_devices % sharded:
            raise ValueError(
                f"MeshSpec {self.axes}: the sharding axes take {sharded} devices, which does not divide "
                f"the {num_devices} devices available; choose axis sizes whose product divides {num_devices}"
            )
        return {DATA: num_devices // sharded, **self.axes}

    def mesh(self, devices: Sequence[Any] | None = None) -> Mesh:
        """Build the mesh (over ``devices``, default ``jax.devices()``), checking it fits."""
        devices = list(jax.devices() if devices is None else devices)
        if self.devices is not None:
            if self.devices > len(devices):
                raise ValueError(f"MeshSpec.devices={self.devices} but only {len(devices)} devices exist")
            devices = devices[: self.devices]
        shape = self.shape(len(devices))
        return jax.make_mesh(
            tuple(shape.values()),
            tuple(shape),
            axis_types=(jax.sharding.AxisType.Auto,) * len(shape),
            devices=devices,
        )


# --- rules: a leaf's path and shape -> its PartitionSpec ------------------------------------------
def replicated(path: str, shape: tuple[int, ...]) -> PartitionSpec:
    """Every device holds the whole leaf."""
    return PartitionSpec()


def split_largest(axis: str, size: int, min_size: int = 1) -> Rule:
    """Split each leaf's largest dimension divisible by ``size`` over ``axis`` (FSDP style);
    leaves with no such dimension, or fewer than ``min_size`` elements, are replicated."""

    def rule(path: str, shape: tuple[int, ...]) -> PartitionSpec:
        if math.prod(shape) < min_size:
            return PartitionSpec()
        dims = [d for d in sorted(range(len(shape)), key=lambda d: -shape[d]) if shape[d] % size == 0]
        if not dims:
            return PartitionSpec()
        spec: list[str | None] = [None] * len(shape)
        spec[dims[0]] = axis
        return PartitionSpec(*spec)

    return rule


def split_last(axis: str, size: int) -> Rule:
    """Split the last dimension (output features / channels) of each leaf of rank >= 2 over
    ``axis`` when divisible (tensor parallelism of the simplest kind); others are replicated."""

    def rule(path: str, shape: tuple[int, ...]) -> PartitionSpec:
        if len(shape) < 2 or shape[-1] % size:
            return PartitionSpec()
        return PartitionSpec(*([None] * (len(shape) - 1)), axis)

    return rule


def combine(*rules: Rule) -> Rule:
    """Apply rules in order; a later rule fills only dimensions earlier ones left unsplit and
    uses only mesh axes they did not."""

    def rule(path: str, shape: tuple[int, ...]) -> PartitionSpec:
        spec: list[Any] = [None] * len(shape)
        for r in rules:
            proposal = list(r(path, shape)) + [None] * len(shape)
            used = {a for a in spec if a is not None}
            for d in range(len(shape)):
                if spec[d] is None and proposal[d] is not None and proposal[d] not in used:
                    spec[d] = proposal[d]
                    used.add(proposal[d])
        return PartitionSpec(*spec)

    return rule


def _trim(spec: tuple[Any, ...]) -> tuple[Any, ...]:
    while spec and spec[-1] is None:
        spec = spec[:-1]
    return spec


@dataclasses.dataclass(frozen=True)
class Layout:
    """Says how a train state is placed on a mesh.

    ``rule(path, shape)`` gives each state leaf its ``PartitionSpec``; the same rule places
    params, the optimizer state, the EMA and pending gradient sums, so an Adam moment sits where
    its parameter does (rules see shapes, and a path such as ``opt_state/0/mu/unet/~/conv/w``).
    Scalars are always replicated. Batches are split along their leading dimension over
    ``batch_axes`` (the data axis, plus an fsdp axis when there is one). A rule asking to split a
    dimension that the axis size does not divide is an error naming the leaf.
    """

    mesh: Mesh
    rule: Rule = replicated
    batch_axes: tuple[str, ...] = (DATA,)

    @classmethod
    def for_mesh(cls, mesh: Mesh) -> Layout:
        """The default layout for a mesh from ``MeshSpec``: an ``fsdp`` axis splits each leaf's
        largest divisible dimension and joins the batch axes; a ``model`` axis splits the last
        dimension of each matrix/kernel; everything else is replicated."""
        rules: list[Rule] = []
        batch_axes = [DATA]
        for name, size in mesh.shape.items():
            if name == DATA or size == 1:
                continue
            if name == "fsdp":
                rules.append(split_largest(name, size))
                batch_axes.append(name)
            elif name == "model":
                rules.append(split_last(name, size))
            else:
                raise ValueError(
                    f"Layout.for_mesh: no default rule for mesh axis {name!r}; pass Layout(rule=...)"
                )
        return cls(mesh, combine(*rules) if rules else replicated, tuple(batch_axes))

    # --- shardings ---------------------------------------------------------------------------
    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def batch_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(self.batch_axes))

    @property
    def data_parallel_size(self) -> int:
        return math.prod(self.mesh.shape[a] for a in self.batch_axes)

    def leaf_sharding(self, path: str, shape: tuple[int, ...]) -> NamedSharding:
        spec = PartitionSpec() if not shape else self.rule(path, tuple(shape))
        spec = PartitionSpec(*_trim(tuple(spec)))  # P(None) and P() are the same placement
        for dim, axis in enumerate(spec):
            if axis is None:
                continue
            size = math.prod(self.mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis))
            if shape[dim] % size:
                raise ValueError(
                    f"Layout: leaf {path!r} of shape {tuple(shape)} cannot split dimension {dim} "
                    f"({shape[dim]}) over mesh axis {axis!r} of size {size}"
                )
        return NamedSharding(self.mesh, spec)

    def shardings(self, tree: Any, prefix: str = "") -> Any:
        """A tree of ``NamedSharding`` shaped like ``tree`` (arrays or ShapeDtypeStructs)."""

        def one(path: tuple[Any, ...], leaf: Any) -> NamedSharding:
            name = "/".join(p for p in (prefix, leaf_path(path)) if p)
            return self.leaf_sharding(name, tuple(np.shape(leaf)))

        return jax.tree_util.tree_map_with_path(one, tree)

    def state_shardings(self, abstract_state: Any) -> Any:
        """Shardings for a ``TrainState`` (or its ``jax.eval_shape``): build them from the
        abstract state, since jit does not place optimizer state like the params by itself."""
        return self.shardings(abstract_state)

    def check_batch(self, batch_size: int, what: str = "batch") -> None:
        """Raise before any step if ``batch_size`` does not split over the data-parallel axes."""
        n = self.data_parallel_size
        if batch_size % n:
            raise ValueError(
                f"{what} size {batch_size} is not divisible by the data-parallel axes {self.batch_axes} "
                f"of size {n}; use a multiple of {n}"
            )

    # --- placing -------------------------------------------------------------------------------
    def place(self, tree: Any, shardings: Any | None = None) -> Any:
        """Put a host or device tree onto the mesh with the layout's (or the given) shardings."""
        return typed_jax.device_put(tree, self.shardings(tree) if shardings is None else shardings)

    def place_batch(self, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
        """This process's share of a batch as global arrays split over the batch axes.

        On one process the share is the whole batch. With several processes each passes its own
        rows and the global batch is their concatenation in process order.
        """
        sharding = self.batch_sharding
        if jax.process_count() == 1:
            return typed_jax.device_put(dict(batch), sharding)
        return {
            k: typed_jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()
        }

    def jit_step(self, step: Callable[..., Any], abstract_state: Any) -> Callable[..., Any]:
        """``step(state, batch) -> (state, stats)`` jitted with explicit shardings: the state
        in and out on ``state_shardings`` (donated), the batch on the batch axes, stats replicated."""
        state_sh = self.state_shardings(abstract_state)
        return typed_jax.jit(
            step,
            in_shardings=(state_sh, self.batch_sharding),
            out_shardings=(state_sh, self.replicated),
            donate_argnums=0,
        )

    def jit_multi_step(
        self, multi: Callable[..., Any], abstract_state: Any, steps: int
    ) -> Callable[..., Any]:
        """``multi(state, batches)`` (``steps.make_multi_step``) jitted as ``jit_step`` is, each of
        its ``steps`` batches on the batch axes."""
        state_sh = self.state_shardings(abstract_state)
        return typed_jax.jit(
            multi,
            in_shardings=(state_sh, (self.batch_sharding,) * steps),
            out_shardings=(state_sh, self.replicated),
            donate_argnums=0,
        )

    def jit_init(self, init: Callable[..., Any], abstract_state: Any) -> Callable[..., Any]:
        """``init(rng, batch) -> state`` jitted to produce the state already on its shardings.
        Its inputs are replicated: the batch is only an example of shapes.

        It runs once, so it is compiled without LLVM's optimisations (``INIT_COMPILER_OPTIONS``):
        a network's initialisers are one threefry draw per parameter, and optimising that code
        cost 4x the compile time (20 s vs 5 s for the tests' tiny SongUNet). The threefry bits
        are the same either way; the floats made from them are too for EDM's U-Net, while for the
        transformers' initialisers the optimised code rounds some values differently (on the CPU,
        ``experiments/sit.py:digits``: 20 of 211 leaves, by at most 1.5e-8). Every fresh state is
        built with these options, so a run's is the same each time."""
        return typed_jax.jit(
            init,
            in_shardings=(self.replicated, self.replicated),
            out_shardings=self.state_shardings(abstract_state),
            compiler_options=INIT_COMPILER_OPTIONS,
        )


#: XLA options for the run-once ``init`` program (see ``Layout.jit_init``).
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def _positive(value: int) -> bool:
    return value >= 1


CONFIG = Section(
    "devices per sharding axis; data parallelism takes the rest",
    {
        "model": Key(
            1,
            "devices on the model (tensor-parallel) axis",
            check=_positive,
            accepted="an int >= 1 (devices on that axis)",
        ),
        "fsdp": Key(
            1,
            "devices on the fsdp (parameter-sharding) axis",
            check=_positive,
            accepted="an int >= 1 (devices on that axis)",
        ),
        "devices": Key(
            0,
            "use only the first N devices (0: all of them, across every process)",
            **at_least(0, "an int >= 0 (0: all devices)"),
        ),
    },
)


def spec_from_config(section: Any) -> MeshSpec:
    """The ``MeshSpec`` a resolved ``config.mesh`` describes."""
    axes = {axis: section[axis] for axis in ("fsdp", "model")}
    return MeshSpec({k: v for k, v in axes.items() if v > 1}, devices=section.devices or None)
