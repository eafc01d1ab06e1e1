"""Reading a persistent step's items through orbax, for ``store.Store``: which items a restore
reads for a template (``restore_items``: the accumulation, power-EMA and data-position checks
made before anything is read), the template checked leaf by leaf against what is stored and each
item's checksums verified before any of its bytes are used (``read_items``), placed arrays for a
template or host arrays without one (``restore_args``), the saved dataset state
(``dataset_state``), and a failed read narrowed to the item that failed (``damaged``).
``manager`` is the store's manager, asked for only when values are read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from dew.checkpointing import layout
from dew.checkpointing import positions as saved_dataset  # the dataset state beside the positions
from dew.checkpointing.errors import CheckpointDamagedError, CheckpointRestorationError, first_line
from dew.checkpointing.step_files import StepFiles
from dew.contracts.state import TrainState


def restore_items(
    files: StepFiles, template: TrainState | None, with_position: bool, read_opt_state: bool
) -> dict[str, Any]:
    """The items a restore of ``files``' step reads, each with its template (None: host
    arrays): the state's items the step holds (``opt_state`` only when ``read_opt_state``), the
    data position when ``with_position``. A template asking for pending accumulation or
    power-EMA slots the step lacks, or a step holding an accumulation the template does not ask
    for, is a ``CheckpointRestorationError``; a data position written but missing is a
    ``CheckpointDamagedError``."""
    step, directory = files.step, files.directory
    present = files.present_items()
    if with_position and layout.DATA_ITEM in files.missing_items():
        raise CheckpointDamagedError(
            f"checkpoint step {step} in {directory} is damaged: item {layout.DATA_ITEM!r} (the "
            "data position) was written but is missing",
            step=step,
            item=layout.DATA_ITEM,
            path=str(files.path / layout.DATA_ITEM),
        )
    wants_pending = template is not None and template.pending is not None
    if wants_pending and "pending" not in present:
        raise CheckpointRestorationError(
            f"checkpoint step {step}: the template has pending accumulation arrays, the checkpoint none"
        )
    if template is not None and not wants_pending and "pending" in present:
        raise CheckpointRestorationError(
            f"checkpoint step {step} holds an unfinished gradient accumulation; pass a template "
            "with pending arrays (see accumulation_template) to resume it"
        )
    wants_power = template is not None and template.power_ema is not None
    if wants_power and "power_ema" not in present:
        raise CheckpointRestorationError(
            f"checkpoint step {step} holds no power-EMA slots (config.ema.power_std_rels) for the "
            "template's; resume with the power-EMA profiles the run was trained with"
        )
    names = [n for n in layout.STATE_ITEMS if n in present or n in files.empty_items()]
    if template is not None and not wants_power:
        names = [n for n in names if n != "power_ema"]
    wanted = {} if template is None else layout.items_from_state(template)
    items = {n: wanted.get(n) for n in names if read_opt_state or n != "opt_state"}
    if with_position and layout.DATA_ITEM in present:
        items[layout.DATA_ITEM] = None
    return items


def read_items(
    manager: Callable[[], ocp.CheckpointManager], files: StepFiles, templates: Mapping[str, Any]
) -> dict[str, Any]:
    """Read the named items of ``files``' step (template or None for host arrays), checking the
    templates against the stored metadata first and each item's checksums before any of its
    bytes are used."""
    step = files.step
    empty = set(files.empty_items()) & set(templates)
    files.verify([item for item in templates if item not in empty])
    stored = files.metadata([item for item in templates if item not in empty])
    problems = []
    for item, template in templates.items():
        if item in empty:
            problems += layout.template_differences(item, template or {}, {})
        elif template is not None:
            problems += layout.template_differences(item, template, layout.stored_leaves(stored[item]))
    if problems:
        raise CheckpointRestorationError(
            f"checkpoint step {step}: the template differs from what is stored in "
            f"{len(problems)} leaves:\n  " + "\n  ".join(problems)
        )
    args = {item: restore_args(templates[item], tree) for item, tree in stored.items()}
    try:
        restored = manager().restore(step, args=ocp.args.Composite(**args))
    except Exception as e:
        raise damaged(manager, files, args, e) from e
    return {item: templates[item] if item in empty else restored[item] for item in templates}


def dataset_state(manager: Callable[[], ocp.CheckpointManager], files: StepFiles, template: Any) -> Any:
    """The saved ``dataset`` pytree in ``template``'s structure, each leaf of the type of the
    template's (``checkpointing.dataset_state``), or None when the step has none."""
    step = files.step
    if layout.DATASET_ITEM in files.empty_items():
        return template
    if layout.DATASET_ITEM not in files.present_items():
        return None
    args = ocp.args.PyTreeRestore(item=template, restore_args=saved_dataset.restore_args(template))
    try:
        restored = manager().restore(step, args=ocp.args.Composite(**{layout.DATASET_ITEM: args}))
    except Exception as e:
        raise CheckpointRestorationError(
            f"checkpoint step {step} in {files.directory}: its dataset state does not fit the template "
            f"given ({type(e).__name__}: {first_line(e)})"
        ) from e
    return saved_dataset.like_template(restored[layout.DATASET_ITEM], template)


def damaged(
    manager: Callable[[], ocp.CheckpointManager], files: StepFiles, args: Mapping[str, Any], error: Exception
) -> CheckpointDamagedError:
    """The ``CheckpointDamagedError`` of a failed read of ``args``, naming the item it came from
    (each read again on its own) when one alone fails."""
    step, directory = files.step, files.directory
    for item, arg in args.items():
        try:
            manager().restore(step, args=ocp.args.Composite(**{item: arg}))
        except Exception as e:  # orbax and tensorstore raise many types
            return CheckpointDamagedError(
                f"checkpoint step {step} in {directory} is damaged: item {item!r} cannot be read "
                f"({type(e).__name__}: {first_line(e)})",
                step=step,
                item=item,
            )
    return CheckpointDamagedError(
        f"checkpoint step {step} in {directory} cannot be read ({type(error).__name__}: {first_line(error)})",
        step=step,
    )


def restore_args(template: Any, stored_tree: Any) -> ocp.args.PyTreeRestore:
    """Placed arrays for a template (its shardings, else the default device); else host arrays."""
    if template is None:
        restore_args = jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
            stored_tree,
            is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"),
        )
        return ocp.args.PyTreeRestore(restore_args=restore_args)
    item = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(
            tuple(leaf.shape),
            leaf.dtype,
            sharding=getattr(leaf, "sharding", None) or layout.default_sharding(),
        ),
        template,
    )
    restore_args = jax.tree.map(
        lambda leaf: ocp.ArrayRestoreArgs(sharding=leaf.sharding, global_shape=leaf.shape, dtype=leaf.dtype),
        item,
    )
    return ocp.args.PyTreeRestore(item=item, restore_args=restore_args)
