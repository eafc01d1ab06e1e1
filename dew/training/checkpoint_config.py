"""``config.checkpoint``: read, defaulted and validated in one place.

The keys (experiments/edm.py shows them all):

    every                        save to the run's checkpoints/ every N steps (and at the end)
    keep                         keep the latest N steps (plus the best, see keep_best)
    keep_best                    also keep the step with the lowest evaluation loss
    asynchronous                 write on a background thread (False: each save lands first)
    local_directory, local_every one more checkpoint, the latest, on each host's own disk
    restore_checkpoint_if_exists resume from the latest checkpoint when there is one
    step_to_restore              resume from this step instead of the latest (must exist)
    restore_dir                  restore from this checkpoints directory when the run's own is empty
    restore_optimizer_state      False: keep the freshly initialised optimizer state
    restore_rng_key              False: keep the freshly initialised rng key
    clear_previous_checkpoints   delete the run's checkpoints before starting (never with a restore)

Every error names the key, the value and what would be accepted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from dew.schema import ConfigError, Key, Section


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    every: int = 500
    keep: int = 2
    keep_best: bool = True
    asynchronous: bool = True
    local_directory: str | None = None
    local_every: int | None = None
    restore_checkpoint_if_exists: bool = True
    step_to_restore: int | None = None
    restore_dir: str | None = None
    restore_optimizer_state: bool = True
    restore_rng_key: bool = True
    clear_previous_checkpoints: bool = False

    @property
    def restores(self) -> bool:
        """Whether the run asks to start from a checkpoint (when one exists)."""
        return self.restore_checkpoint_if_exists or self.step_to_restore is not None


_FIELDS = {f.name: f for f in dataclasses.fields(CheckpointSettings)}


def _fail(key: str, value: Any, accepted: str) -> ConfigError:
    return ConfigError(f"config.checkpoint.{key}={value!r} is invalid: expected {accepted}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checkpoint_settings(section: ml_collections.ConfigDict | dict) -> CheckpointSettings:
    """Validate ``config.checkpoint``; keys it does not set take the defaults above."""
    values = dict(section.to_dict() if isinstance(section, ml_collections.ConfigDict) else section)
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) config.checkpoint.{unknown}: known keys are {sorted(_FIELDS)}"
        )
    s = CheckpointSettings(**values)
    for key in ("every", "keep"):
        if not _is_int(getattr(s, key)) or getattr(s, key) < 1:
            raise _fail(key, getattr(s, key), "an int >= 1")
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
    for key in ("restore_dir", "local_directory"):
        value = getattr(s, key)
        if value is not None and (not isinstance(value, str) or not value):
            raise _fail(key, value, "None or a non-empty path")
    if s.local_every is not None and (not _is_int(s.local_every) or s.local_every < 1):
        raise _fail("local_every", s.local_every, "None or an int >= 1")
    if (s.local_directory is None) != (s.local_every is None):
        raise ConfigError(
            "config.checkpoint.local_directory and config.checkpoint.local_every go together: got "
            f"local_directory={s.local_directory!r}, local_every={s.local_every!r}"
        )
    if s.clear_previous_checkpoints and (s.restores or s.restore_dir is not None):
        raise ConfigError(
            "config.checkpoint.clear_previous_checkpoints=True cannot be combined with a restore "
            f"(restore_checkpoint_if_exists={s.restore_checkpoint_if_exists}, "
            f"step_to_restore={s.step_to_restore!r}, restore_dir={s.restore_dir!r}): "
            "set restore_checkpoint_if_exists=False and leave step_to_restore and restore_dir unset"
        )
    return s


# --- the config.checkpoint section of the schema (an adapter over CheckpointSettings) --------------
_DOCS = {
    "every": "save to the run's checkpoints/ every N steps (and at the end)",
    "keep": "keep the latest N steps (plus the best, see keep_best)",
    "keep_best": "also keep the step with the lowest evaluation loss (needs eval.every > 0)",
    "asynchronous": "write on a background thread (False: each save lands first)",
    "local_directory": "one more checkpoint, the latest, on each host's own disk (with local_every)",
    "local_every": "steps between local checkpoints (with local_directory)",
    "restore_checkpoint_if_exists": "resume from the latest checkpoint when there is one",
    "step_to_restore": "resume from this step instead of the latest (must exist)",
    "restore_dir": "restore from this checkpoints directory when the run's own is empty",
    "restore_optimizer_state": "False: keep the freshly initialised optimizer state",
    "restore_rng_key": "False: keep the freshly initialised rng key",
    "clear_previous_checkpoints": "delete the run's checkpoints before starting (never with a restore)",
}
_KINDS = {"local_directory": str, "local_every": int, "step_to_restore": int, "restore_dir": str}

CONFIG = Section(
    "checkpoints under <workdir>/checkpoints: the latest `keep` plus the best",
    {
        f.name: Key(f.default, _DOCS[f.name], kind=_KINDS.get(f.name))
        for f in dataclasses.fields(CheckpointSettings)
    },
    validate=lambda section, path: checkpoint_settings(section),
)
