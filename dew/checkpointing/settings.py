"""``config.checkpoint``: read, defaulted and validated in one place.

The keys (experiments/edm.py shows them all):

    directory                    where the checkpoints go: a path or URI (file://, gs://, ...);
                                 None: <workdir>/checkpoints
    every                        save every N steps (and at the end); None or 0: no checkpointer
    keep                         keep the latest N steps (plus the best, see keep_best); None: all
    keep_best                    also keep the step with the lowest best_metric
    best_metric                  the reported metric ranking the best step (lowest wins): "loss"
                                 is the evaluation loss, any other name a metric evaluation reports
    asynchronous                 write on a background thread (False: each save lands first)
    local_directory, local_every one more checkpoint, the latest, on each host's own disk
    restore_checkpoint_if_exists resume from the latest checkpoint when there is one
    step_to_restore              resume from this step instead of the latest (must exist)
    restore_dir                  restore from this checkpoints directory when the run's own is empty
    restore_optimizer_state      False: keep the freshly initialised optimizer state
    restore_rng_key              False: keep the freshly initialised rng key
    clear_previous_checkpoints   delete the run's checkpoints before starting (never with a restore)
    on_rollback                  a step_to_restore older than the run's latest: "move" the newer
                                 steps to a sibling directory, or "delete" them

Every error names the key, the value and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections

from dew.checkpointing import layout as paths  # directories as paths or URIs
from dew.checkpointing.errors import CheckpointRestorationError
from dew.schema import ConfigError, Key, Section


class CheckpointingOffError(ConfigError, CheckpointRestorationError):
    """A restore was requested from a run whose checkpointing is off: both a config error (the
    CLI exits 2 before any work) and the ``CheckpointRestorationError`` the stix text names."""


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    directory: str | None = None
    every: int | None = 500
    keep: int | None = 2
    keep_best: bool = True
    best_metric: str = "loss"
    asynchronous: bool = True
    local_directory: str | None = None
    local_every: int | None = None
    restore_checkpoint_if_exists: bool = True
    step_to_restore: int | None = None
    restore_dir: str | None = None
    restore_optimizer_state: bool = True
    restore_rng_key: bool = True
    clear_previous_checkpoints: bool = False
    on_rollback: str = "move"

    @property
    def enabled(self) -> bool:
        """Whether the run has a checkpointer (``every`` is neither None nor 0)."""
        return bool(self.every)

    @property
    def restores(self) -> bool:
        """Whether the run asks to start from a checkpoint (when one exists)."""
        return self.restore_checkpoint_if_exists or self.step_to_restore is not None

    def checkpoint_directory(self, workdir: str) -> str:
        """The persistent directory: ``directory``, or ``<workdir>/checkpoints``."""
        return self.directory if self.directory is not None else os.path.join(workdir, "checkpoints")

    def checkpoints(self, workdir: str, **kwargs: Any) -> Any:
        """The run's ``Checkpoints``, or None when checkpointing is off."""
        if not self.enabled:
            return None
        from dew.checkpointing.checkpoints import Checkpoints

        return Checkpoints(
            self.checkpoint_directory(workdir),
            keep=self.keep,
            keep_best=self.keep_best,
            best_metric=self.best_metric,
            asynchronous=self.asynchronous,
            local_directory=self.local_directory,
            local_every=self.local_every,
            **kwargs,
        )


_FIELDS = {f.name: f for f in dataclasses.fields(CheckpointSettings)}


def _fail(key: str, value: Any, accepted: str) -> ConfigError:
    return ConfigError(f"config.checkpoint.{key}={value!r} is invalid: expected {accepted}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checkpoint_settings(section: ml_collections.ConfigDict | dict[str, Any]) -> CheckpointSettings:
    """Validate ``config.checkpoint``; keys it does not set take the defaults above."""
    values = dict(section.to_dict() if isinstance(section, ml_collections.ConfigDict) else section)
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) config.checkpoint.{unknown}: known keys are {sorted(_FIELDS)}"
        )
    s = CheckpointSettings(**values)
    if s.every is not None and (not _is_int(s.every) or s.every < 0):
        raise _fail("every", s.every, "None or 0 (no checkpointing) or an int >= 1")
    if s.keep is not None and (not _is_int(s.keep) or s.keep < 1):
        raise _fail("keep", s.keep, "None (keep every step) or an int >= 1")
    if not isinstance(s.best_metric, str) or not s.best_metric:
        raise _fail("best_metric", s.best_metric, 'a metric name, e.g. "loss"')
    if s.on_rollback not in ("move", "delete"):
        raise _fail("on_rollback", s.on_rollback, '"move" or "delete"')
    for key in (
        "keep_best",
        "asynchronous",
        "restore_checkpoint_if_exists",
        "restore_optimizer_state",
        "restore_rng_key",
        "clear_previous_checkpoints",
    ):
        if not isinstance(getattr(s, key), bool):
            raise _fail(key, getattr(s, key), "a bool (true/false)")
    if s.step_to_restore is not None and (not _is_int(s.step_to_restore) or s.step_to_restore < 1):
        raise _fail("step_to_restore", s.step_to_restore, "None (the latest) or an int >= 1")
    for key in ("directory", "restore_dir", "local_directory"):
        value = getattr(s, key)
        if value is not None and (not isinstance(value, str) or not value):
            raise _fail(
                key, value, "None or a non-empty path" + (" or URI" if key != "local_directory" else "")
            )
    for key in ("directory", "restore_dir"):
        value = getattr(s, key)
        if value is not None:
            try:
                paths.directory(value, f"config.checkpoint.{key}")
            except paths.DirectoryError as e:
                raise ConfigError(str(e)) from None
    if s.local_every is not None and (not _is_int(s.local_every) or s.local_every < 1):
        raise _fail("local_every", s.local_every, "None or an int >= 1")
    if (s.local_directory is None) != (s.local_every is None):
        raise ConfigError(
            "config.checkpoint.local_directory and config.checkpoint.local_every go together: got "
            f"local_directory={s.local_directory!r}, local_every={s.local_every!r}"
        )
    if not s.enabled and (s.step_to_restore is not None or s.restore_dir is not None):
        raise CheckpointingOffError(
            f"config.checkpoint.every={s.every!r} turns checkpointing off, but a restore is requested "
            f"(step_to_restore={s.step_to_restore!r}, restore_dir={s.restore_dir!r}): set every to an "
            "int >= 1, or leave step_to_restore and restore_dir unset"
        )
    if s.clear_previous_checkpoints and (s.restores or s.restore_dir is not None):
        raise ConfigError(
            "config.checkpoint.clear_previous_checkpoints=True cannot be combined with a restore "
            f"(restore_checkpoint_if_exists={s.restore_checkpoint_if_exists}, "
            f"step_to_restore={s.step_to_restore!r}, restore_dir={s.restore_dir!r}): "
            "set restore_checkpoint_if_exists=False and leave step_to_restore and restore_dir unset"
        )
    if s.restore_dir is not None:
        _check_restore_dir(s.restore_dir)
    return s


def _check_restore_dir(value: str) -> None:
    """A local ``restore_dir`` must be a directory holding at least one checkpoint step (else a
    run would silently train from its random initialisation); a remote one is read at the restore."""
    path = paths.directory(value, "config.checkpoint.restore_dir")
    if not paths.is_local(path):
        return
    if not os.path.exists(path):
        found = "does not exist"
    elif not os.path.isdir(path):
        found = "is not a directory"
    else:
        try:
            found = None if stored_steps(os.fspath(path)) else "holds no checkpoint step"
        except OSError as e:
            found = f"cannot be listed ({e.strerror})"
    if found is not None:
        raise _fail(
            "restore_dir",
            value,
            f"a directory holding checkpoints (e.g. a previous run's <workdir>/checkpoints); {path} {found}",
        )


def stored_steps(directory: str, local_directory: str | None = None) -> list[int] | None:
    """The steps a checkpoint directory (a path or URI) holds and, given, a local tier's process
    directories, read from their directories' names alone (no orbax manager, no JAX backend):
    [] where none exists, None for a remote directory (listed at the restore instead)."""
    path = paths.directory(directory)
    if not paths.is_local(path):
        return None
    roots = [os.fspath(path)]
    if local_directory is not None and os.path.isdir(local_directory):
        roots += [os.path.join(local_directory, n) for n in os.listdir(local_directory)]
    return sorted(
        {
            int(n)
            for root in roots
            if os.path.isdir(root)
            for n in os.listdir(root)
            if n.isdigit() and os.path.isdir(os.path.join(root, n))
        }
    )


# --- the config.checkpoint section of the schema (an adapter over CheckpointSettings) --------------
_DOCS = {
    "directory": "where checkpoints go: a path or URI (file://, gs://, ...); None: <workdir>/checkpoints",
    "every": "save every N steps (and at the end); None or 0: no checkpointer",
    "keep": "keep the latest N steps (plus the best, see keep_best); None: every step",
    "keep_best": "also keep the step with the lowest best_metric (needs a metric reported at saves)",
    "best_metric": "the reported metric ranking the best step, lowest wins ('loss': the evaluation loss)",
    "asynchronous": "write on a background thread (False: each save lands first)",
    "local_directory": "one more checkpoint, the latest, on each host's own disk (with local_every)",
    "local_every": "steps between local checkpoints (with local_directory)",
    "restore_checkpoint_if_exists": "resume from the latest checkpoint when there is one",
    "step_to_restore": "resume from this step instead of the latest (must exist; older: a rollback)",
    "restore_dir": "restore from this checkpoints directory when the run's own is empty",
    "restore_optimizer_state": "False: keep the freshly initialised optimizer state",
    "restore_rng_key": "False: keep the freshly initialised rng key",
    "clear_previous_checkpoints": "delete the run's checkpoints before starting (never with a restore)",
    "on_rollback": "step_to_restore older than the latest: 'move' newer steps to a sibling dir, or 'delete'",
}
_KINDS = {
    "directory": str,
    "every": int,
    "keep": int,
    "local_directory": str,
    "local_every": int,
    "step_to_restore": int,
    "restore_dir": str,
}
_OPTIONAL = {"every", "keep"}

CONFIG = Section(
    "checkpoints under checkpoint.directory (<workdir>/checkpoints): the latest `keep` plus the best",
    {
        f.name: Key(f.default, _DOCS[f.name], kind=_KINDS.get(f.name), optional=f.name in _OPTIONAL)
        for f in dataclasses.fields(CheckpointSettings)
    },
    validate=lambda section, path: checkpoint_settings(section),
)
