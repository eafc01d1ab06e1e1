"""``RestorePolicy``: which state a run starts from, as ``config.checkpoint`` asks, in one place.

The Trainer builds one and asks it for the initial state; a user's own loop can do the same. The
policy, in order:

1. ``clear_previous_checkpoints``: this run's checkpoints are deleted first (its tracking and
   previews moved aside);
2. a run that does not restore (``restore_checkpoint_if_exists=False`` and no
   ``step_to_restore``) refuses a directory that holds checkpoints;
3. the source is this run's checkpoints, or ``restore_dir``'s while this run has none;
4. ``step_to_restore`` below the latest rolls back (newer steps moved aside or deleted);
5. the latest step may be damaged or incomplete: it is set aside (never deleted) and the newest
   intact one is used; a step asked for by number is never replaced;
6. the step is verified, checked against this config (shapes, dtypes, the config it was
   written with), read (``restore_optimizer_state`` / ``restore_rng_key`` False keep the fresh
   state's values), and its data position handed to the data stream, carried over by example
   index when the batch size or process count changed.

Before a resume reads any value, the checkpoint must fit the run the config now describes. Each
check fails with one ``ResumeMismatchError`` (a ``ConfigError``: the CLI exits 2) naming what
changed, from what, to what, using ``run.json``'s record of the start that wrote the step
(``dew.run_records.writer_of``) for the config side and the checkpoint's own metadata for shapes:

- ``num_steps`` below the step to resume from;
- the model's parameter shapes (e.g. ``model.channels`` changed), or the optimizer's state;
- the batch size or the number of processes, when the data position cannot be carried over.
  A position counts batches of the batch size it was written with; it is carried over by
  example index (``remap_position``), exactly when the examples consumed so far in the epoch
  fill whole batches of the new size, and otherwise to the next batch boundary, saying how many
  examples of that epoch are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from dew.checkpointing.checkpoints import Checkpoints
from dew.checkpointing.errors import CheckpointDamagedError, CheckpointRestorationError, first_line
from dew.checkpointing.settings import CheckpointSettings
from dew.data.dataset import DataPartition
from dew.run_records import set_aside_records, writer_of
from dew.schema import ConfigError


class DataStream(Protocol):
    """What the policy needs of the run's training data: its share, its epoch length and the
    means to continue from a saved position (``dew.data.Dataset``)."""

    share: DataPartition
    batches_per_epoch: int

    def read_position(self, saved: bytes, /) -> None: ...


@dataclasses.dataclass
class RestorePolicy:
    """The restore policy of one run (the module docstring lists it).

    ``checkpoints``: the run's own (None: checkpointing off, always a fresh start);
    ``settings``: ``config.checkpoint``; ``workdir``: where ``run.json`` says which config wrote
    each step; ``config``: this run's resolved config as a dict; ``batch_size``: its global batch.
    ``restored_step`` is set by ``initial_state`` (None: a fresh start).
    """

    checkpoints: Checkpoints | None
    settings: CheckpointSettings
    workdir: str
    config: dict[str, Any]
    batch_size: int
    restored_step: int | None = None

    def check_resumable(self, num_steps: int) -> None:
        """Bad input a resume would only find later, checked before anything is written:
        ``num_steps`` below the step to resume from (``ResumeMismatchError``)."""
        s = self.settings
        if self.checkpoints is None or s.clear_previous_checkpoints or not s.restores:
            return
        step = s.step_to_restore if s.step_to_restore is not None else self.checkpoints.latest_step()
        if step is not None:
            check_num_steps(num_steps, step, self.checkpoints.path(step))

    def initial_state(self, fresh: Callable[[], Any], template: Callable[[], Any], data: DataStream) -> Any:
        """The state the run starts from: ``fresh()`` or a checkpoint read against
        ``template()`` (abstract arrays with the run's shardings), with ``data`` moved to the
        checkpoint's position."""
        s = self.settings
        if self.checkpoints is None:
            return fresh()
        if s.clear_previous_checkpoints:
            self.checkpoints.clear()
            aside = set_aside_records(self.workdir)
            if aside:
                print(f"previous tracking and previews moved to {aside}", flush=True)
        if not s.restores:
            latest = self.checkpoints.latest_step()
            if latest is not None:
                raise CheckpointRestorationError(
                    f"{self.checkpoints.directory} already holds checkpoints (latest step "
                    f"{latest}) and config.checkpoint.restore_checkpoint_if_exists=False: "
                    "set clear_previous_checkpoints=True to start over, or choose another --workdir"
                )
            return fresh()
        source = self.checkpoints
        if s.restore_dir is not None and self.checkpoints.latest_step() is None:
            source = Checkpoints(s.restore_dir, read_only=True)
        if s.step_to_restore is None and source.latest_step() is None:
            return fresh()
        if source is self.checkpoints and s.step_to_restore is not None:
            # Rolling back: the newer steps are moved aside or deleted (and logged), so this
            # run's saves never collide with the abandoned continuation's.
            self.checkpoints.roll_back(s.step_to_restore, how=s.on_rollback)
        step = s.step_to_restore if s.step_to_restore is not None else source.latest_step()
        falls_back = s.step_to_restore is None and source is self.checkpoints
        assert step is not None, "a step to restore exists (fresh() returned above otherwise)"
        while True:
            try:
                state, position, written_by = self._read(source, step, fresh, template, data.share)
                break
            except CheckpointDamagedError as e:
                if not falls_back:
                    raise
                aside = source.set_aside_damaged(step)
                newer = source.latest_step()
                print(
                    f"checkpoint step {step} is damaged or incomplete, kept aside in {aside}; resuming "
                    f"from {'the start' if newer is None else f'step {newer}'} ({first_line(e)})",
                    flush=True,
                )
                if newer is None:
                    return fresh()
                step = newer
        if position is not None:
            self._continue_data(data, position, written_by, step)
        elif source is self.checkpoints:
            raise CheckpointRestorationError(
                f"checkpoint step {step} ({source.path(step)}) holds no data position (its 'data' "
                "item is missing): resuming would silently restart the data stream from its first "
                "batch. Restore another step with config.checkpoint.step_to_restore, or start over"
            )
        self.restored_step = int(jax.device_get(state.step))
        return state

    def _read(
        self,
        source: Checkpoints,
        step: int,
        fresh: Callable[[], Any],
        template: Callable[[], Any],
        share: DataPartition,
    ) -> tuple[Any, bytes | None, dict[str, Any] | None]:
        """Verify ``step``'s checksums, check it fits this config, then read it: the state, the
        data position, and run.json's record of the start that wrote it."""
        s = self.settings
        source.verify(step)
        written_by = writer_of(self.workdir, step) if source is self.checkpoints else None
        wanted = template()
        check_state(
            source.stored(step),
            wanted,
            step,
            source.path(step),
            None if written_by is None else written_by["config"],
            self.config,
        )
        share = _share_written(share, written_by)
        if s.restore_optimizer_state and s.restore_rng_key:
            state, position = source.restore(wanted, step, share=share)
        else:
            state, position = source.resume(
                fresh(),
                step,
                share=share,
                restore_optimizer_state=s.restore_optimizer_state,
                restore_rng_key=s.restore_rng_key,
            )
        return state, position, written_by

    def _continue_data(
        self, data: DataStream, position: bytes, written_by: dict[str, Any] | None, step: int
    ) -> None:
        """Continue the data stream from a checkpoint's position, carried over by example index
        when run.json says it was written with another batch size or process count."""
        batch_size, processes = self.batch_size, data.share.count
        old_batch, old_processes = data_layout_changes(written_by, batch_size, processes)
        if old_batch is not None:
            position, account = remap_position(position, old_batch, batch_size, data.batches_per_epoch)
            print(f"config.dataset.batch_size: {old_batch} -> {batch_size}; {account}", flush=True)
        elif old_processes is not None:
            print(
                f"number of processes changed from {old_processes} to {processes} (global batch "
                f"{batch_size} unchanged): the data position counts global batches and carries over",
                flush=True,
            )
        try:
            data.read_position(position)
        except ValueError as e:
            was = f" (written with batch size {old_batch})" if old_batch else ""
            raise ResumeMismatchError(
                f"cannot resume from step {step}: its data position{was} does not fit "
                f"config.dataset.batch_size={batch_size} on {processes} process(es): {e}"
            ) from None


def _share_written(share: DataPartition, written_by: dict[str, Any] | None) -> DataPartition:
    """The share whose stored position this process continues from: its own, or, when run.json
    says the step was written by another number of processes, share 0 of those. The training
    stream's position counts global batches (every share takes one batch per step, and all
    shares have the same batches per epoch), so each stored share holds the same position."""
    old = None if written_by is None else written_by.get("processes")
    if old is None or int(old) == share.count:
        return share
    return DataPartition(0, int(old))


# --- does the checkpoint fit the run the config describes? ----------------------------------------
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
    "DataStream",
    "RestorePolicy",
    "ResumeMismatchError",
    "check_num_steps",
    "check_state",
    "config_changes",
    "data_layout_changes",
    "remap_position",
    "tree_differences",
]
