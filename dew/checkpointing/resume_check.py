"""Before a resume reads any value: does the checkpoint fit the run the config now describes?

Each check fails with one ``ResumeMismatchError`` (a ``ConfigError``: the CLI exits 2) naming
what changed, from what, to what, using ``run.json``'s record of the start that wrote the step
(``run_history.writer_of``) for the config side and the checkpoint's own metadata for shapes:

- ``num_steps`` below the step to resume from;
- the model's parameter shapes (e.g. ``model.channels`` changed), or the optimizer's state;
- the batch size or the number of processes, when the data position cannot be carried over.
  A position counts batches of the batch size it was written with; it is carried over by
  example index (``remap_position``), exactly when the examples consumed so far in the epoch
  fill whole batches of the new size, and otherwise to the next batch boundary, saying how many
  examples of that epoch are skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from dew.schema import ConfigError

_MAX_LISTED = 1


class ResumeMismatchError(ConfigError):
    """The config asks for a run the checkpoint it would resume from cannot continue."""


def check_num_steps(num_steps: int, step: int, path: str) -> None:
    """``num_steps`` below the step a resume would start from is bad input, not "done"."""
    if num_steps < step:
        raise ResumeMismatchError(
            f"config.train.num_steps={num_steps} is below the step this run would resume from "
            f"({step}, {path}): raise num_steps to train further, restore an earlier step with "
            "config.checkpoint.step_to_restore, or use another --workdir"
        )


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping (a config) as ``{"a.b.c": leaf}``, tuples as lists (as JSON keeps them)."""
    out: dict[str, Any] = {}
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    out[prefix[:-1]] = list(tree) if isinstance(tree, tuple | list) else tree
    return out


def config_changes(
    old: Mapping[str, Any] | None, new: Mapping[str, Any], under: tuple[str, ...] = ()
) -> list[str]:
    """``["config.model.channels: 8 -> 16", ...]`` for keys (under the given prefixes) whose
    value differs between two configs; [] when ``old`` is unknown."""
    if old is None:
        return []
    a, b = flatten(old), flatten(json.loads(json.dumps(dict(new))))
    keys = sorted(k for k in set(a) | set(b) if not under or k.startswith(under))
    missing = "(absent)"
    return [
        f"config.{k}: {a.get(k, missing)!r} -> {b.get(k, missing)!r}"
        for k in keys
        if a.get(k, missing) != b.get(k, missing)
    ]


def _leaves(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """Array leaves by path, the path normalised to ``a/b/c`` so a nested tree and a flat dict
    keyed by ``"['a']['b']"`` (the local tier's layout) name a leaf alike."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    out = {}
    for path, leaf in flat:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            name = "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
            out[re.sub(r"/+", "/", re.sub(r"[\[\]'\".]+", "/", name)).strip("/")] = (
                tuple(int(d) for d in leaf.shape),
                str(np.dtype(leaf.dtype)),
            )
    return out


def tree_differences(stored: Any, wanted: Any) -> list[str]:
    """Leaves whose shape or dtype differ, or that only one side has, as readable lines ([] when
    the two hold the same arrays). Sameness is judged on the multiset of shapes and dtypes, so a
    tree whose containers were stored under other names (tuples as lists, a flat dict) still
    matches; the lines name leaves by path where the two sides' paths agree."""
    a, b = _leaves(stored), _leaves(wanted)
    if sorted(a.values()) == sorted(b.values()):
        return []
    lines = []
    if set(a) & set(b):
        for key in sorted(set(a) | set(b)):
            if key not in b:
                lines.append(f"{key} only in the checkpoint")
            elif key not in a:
                lines.append(f"{key} not in the checkpoint")
            elif a[key] != b[key]:
                lines.append(f"{key} {a[key][0]} {a[key][1]} -> {b[key][0]} {b[key][1]}")
    return lines or [f"{len(a)} stored arrays vs {len(b)} wanted, of other shapes"]


def check_state(
    stored: Any,
    template: Any,
    step: int,
    path: str,
    old_config: Mapping[str, Any] | None,
    config: Mapping[str, Any],
) -> None:
    """The checkpoint's parameter and optimizer-state shapes must be the ones this config
    builds; the message names the config keys that changed and the first differing arrays."""
    for field, what, keys in (
        ("params", "the model's parameters", ("model.", "objective.", "dataset.")),
        ("opt_state", "the optimizer's state", ("optimizer.",)),
    ):
        stored_tree, wanted = getattr(stored, field), getattr(template, field)
        if stored_tree is None or wanted is None:
            continue
        diff = tree_differences(stored_tree, wanted)
        if not diff:
            continue
        changed = config_changes(old_config, config, keys)
        cause = "; ".join(changed) if changed else "config changes not recorded in run.json"
        more = f" (and {len(diff) - _MAX_LISTED} more)" if len(diff) > _MAX_LISTED else ""
        raise ResumeMismatchError(
            f"cannot resume from step {step} ({path}): {what} changed since it was written "
            f"({cause}); {len(diff)} array(s) differ, e.g. {'; '.join(diff[:_MAX_LISTED])}{more}. "
            "Resume with the values it was written with, or start over in another --workdir"
        )


def data_layout_changes(
    old: Mapping[str, Any] | None, batch_size: int, processes: int
) -> tuple[int | None, int | None]:
    """(old global batch size, old process count) when they differ from now, else None each."""
    if old is None:
        return None, None
    old_batch = (old.get("config") or {}).get("dataset", {}).get("batch_size")
    old_processes = old.get("processes")
    return (
        old_batch if old_batch is not None and old_batch != batch_size else None,
        old_processes if old_processes is not None and old_processes != processes else None,
    )


def remap_position(saved: bytes, old_batch: int, new_batch: int, batches_per_epoch: int) -> tuple[bytes, str]:
    """Carry a ``{"epoch", "batch"}`` data position counted in global batches of ``old_batch``
    over to ``new_batch`` by example index; return the new position and a one-line account.

    Batches never straddle epochs, so the examples consumed in the current epoch are
    ``batch * old_batch``; the new position is the first batch boundary at or after them (the
    next epoch's start when none is left in this one)."""
    try:
        fields = json.loads(bytes(saved).decode())
        epoch, batch = int(fields["epoch"]), int(fields["batch"])
    except (ValueError, KeyError, TypeError) as e:
        raise ResumeMismatchError(
            f"the data position {bytes(saved)[:80]!r} cannot be carried over from batch size {old_batch} "
            f"to {new_batch}: it is not an {{epoch, batch}} position ({e})"
        ) from None
    consumed = batch * old_batch
    new = -(-consumed // new_batch)
    skipped = new * new_batch - consumed
    new_epoch = epoch
    if new >= batches_per_epoch:
        new_epoch, new, skipped = epoch + 1, 0, None
    account = (
        f"data position carried over by example index: epoch {epoch}, {consumed} examples in "
        f"(batch {batch} of {old_batch}) -> epoch {new_epoch} batch {new} of {new_batch}"
    )
    if skipped is None:
        account += f" (the rest of epoch {epoch} is skipped)"
    elif skipped:
        account += f" ({skipped} examples of epoch {epoch} skipped to reach a whole batch)"
    out = dict(fields, epoch=new_epoch, batch=new)
    return json.dumps(out, sort_keys=True).encode(), account


__all__ = [
    "ResumeMismatchError",
    "check_num_steps",
    "check_state",
    "config_changes",
    "data_layout_changes",
    "remap_position",
    "tree_differences",
]
