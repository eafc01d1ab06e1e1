"""The weights of one step of a run's checkpoints, for a reader that samples or scores with them
(``dew.pipeline``, and through it ``dew.sample`` and ``python -m dew.fid``), and the EMA's
debiasing that ``Checkpoints.restore_ema`` shares.

``stored_steps(directory)`` lists the steps that have landed; ``read_weights(directory, step,
template, raw=...)`` reads the debiased EMA (``ema_params`` and ``extra``: the step count and
the EMA's law) or, with ``raw``, the live ``params`` (and ``extra``'s step count), never the
optimizer state. It opens the persistent tier only, read-only: no writer, tiers or retention,
and the orbax manager it opens cleans up nothing, so a live run's in-flight save is left alone.
The step's files are read as a resume reads them (``step_files.StepFiles``,
``item_reads.read_items``): each item's checksums verified and the template checked against
what is stored before a value is used, the step count checked against the step's metadata, a
damaged step one ``CheckpointDamagedError`` naming it; nothing is pickled.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from dew.averaging import ema as ema_lib
from dew.checkpointing import layout
from dew.checkpointing.errors import CheckpointRestorationError
from dew.checkpointing.item_reads import read_items
from dew.checkpointing.step_files import StepFiles
from dew.checkpointing.store import landed_steps, open_manager
from dew.contracts.state import num_updates


def stored_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the checkpoint directory ``directory`` that have landed, ascending (a
    directory that does not exist holds none)."""
    root = layout.directory(directory)
    with _manager(root) as manager:
        return landed_steps(root, manager)


@contextlib.contextmanager
def _manager(root: epath.Path) -> Iterator[Callable[[], ocp.CheckpointManager]]:
    """A reader's orbax manager of ``root``, opened on first call (never to list the steps of
    one process on a local disk) and closed on leaving."""
    opened: list[ocp.CheckpointManager] = []

    def manager() -> ocp.CheckpointManager:
        if not opened:
            opened.append(open_manager(root, writing=False))
        return opened[0]

    try:
        yield manager
    finally:
        for m in opened:
            m.close()


def read_weights(directory: str | os.PathLike, step: int, template: Any = None, *, raw: bool = False) -> Any:
    """The debiased EMA parameters of ``step`` in the checkpoint directory ``directory`` (or,
    with ``raw``, the live parameters), as ``Checkpoints.restore_ema`` (``restore``) gives them.

    ``template`` is a params tree of ``jax.ShapeDtypeStruct`` (or arrays, optionally sharded)
    checked leaf by leaf against what is stored and placed as it says; None reads host arrays.
    A step that is not stored is a ``CheckpointRestorationError``, a damaged one a
    ``CheckpointDamagedError``, each naming the step and the directory."""
    root = layout.directory(directory)
    if step not in stored_steps(root):
        raise CheckpointRestorationError(f"no checkpoint for step {step} in {os.fspath(root)}")
    item = "params" if raw else "ema_params"
    files = StepFiles(root, step)
    with _manager(root) as manager:
        restored = read_items(manager, files, {item: template, "extra": None})
    count = int(np.asarray(restored["extra"]["step"]))
    files.check_step(count)
    if raw:
        return restored[item]
    where = f"checkpoint step {step} in {os.fspath(root)}"
    return debiased(restored[item], count, restored["extra"].get("ema"), files.ema_record(), where)


def debiased(
    ema: Any,
    count: int,
    law: Any,
    record: Mapping[str, Any] | None,
    where: str,
    decay: float | ema_lib.EMASpec | None = None,
    accumulation: int | None = None,
) -> Any:
    """The raw EMA ``ema`` of a step at ``count`` train steps, debiased as the live loop does,
    ``ema / (1 − Π β_i)`` over the optimizer updates behind it (``count // accumulation``).

    The law is the one ``extra`` stores (``law``), else the older metadata ``record`` of the step
    (``dew.averaging.ema.record``; an assumed default there gives way to an explicit ``decay``).
    An explicit ``decay`` (a β or an ``EMASpec``) or ``accumulation`` that contradicts the law is
    a ``ValueError``; without any law, ``decay`` is required (``CheckpointRestorationError``
    naming ``where`` otherwise)."""
    if law is not None:
        recorded = ema_lib.from_law(law, ema)
    else:  # a checkpoint from before extra held the law: its metadata record, if any
        recorded = None if record is None else ema_lib.from_record(dict(record))
    if (record or {}).get(layout.ASSUMED) and decay is not None:
        recorded = None  # a default the saver assumed: the caller's law replaces it
    spec, k = _law_to_use(recorded, decay, accumulation, where)
    return ema_lib.debias(ema, spec, num_updates(count, k))


def _law_to_use(
    recorded: tuple[Any, int] | None, decay: Any, accumulation: int | None, where: str
) -> tuple[Any, int]:
    """The ``EMASpec`` and accumulation to debias with: the recorded ones, checked against any
    explicit argument; without a record, the arguments (a decay is then required)."""
    if recorded is None:
        if decay is None:
            raise CheckpointRestorationError(
                f"{where} records no EMA law (its state carried none: TrainState.ema_law is set by "
                "make_init with an EMASpec): pass decay= (the run's β or EMASpec) and accumulation="
            )
        spec = decay if isinstance(decay, ema_lib.EMASpec) else ema_lib.EMASpec(decay=float(decay))
        return spec, 1 if accumulation is None else int(accumulation)
    spec, k = recorded
    if decay is not None:
        given = decay if isinstance(decay, ema_lib.EMASpec) else ema_lib.EMASpec(decay=float(decay))
        if not ema_lib.same_law(given, spec):
            raise ValueError(
                f"restore_ema: decay={decay!r} contradicts the EMA {where} records (decay={spec.decay}, "
                f"half_life={spec.half_life}, ramp_up={spec.ramp_up}); leave decay unset to use the record"
            )
    if accumulation is not None and int(accumulation) != k:
        raise ValueError(
            f"restore_ema: accumulation={accumulation} contradicts the {k} micro-batches per update {where} "
            "records; leave it unset to use the record"
        )
    return spec, k
