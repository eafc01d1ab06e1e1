"""The stix configs, ``TrainingIOHandlerConfig`` and ``CheckpointerConfig``: keyword-only,
validated on construction like the pydantic models they are documented as, without pydantic.

Construction checks every field (types, ``> 0`` bounds, cross-field rules) and rejects an unknown
key, naming it, the closest known key and every accepted one; errors are ``ConfigValidationError``
(a ``ValueError``). ``model_dump()`` gives the fields as a dict, ``model_config`` is the documented
one. Both configs reject unknown keys (a typo never silently falls back to a default), also
``CheckpointerConfig``, whose documented ``model_config`` only allows arbitrary types.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from typing import Any, ClassVar


class ConfigValidationError(ValueError):
    """A stix config got a value it does not accept; the message names the field."""


@dataclasses.dataclass(frozen=True)
class _Field:
    default: Any
    check: Callable[[Any], bool]
    accepted: str
    required: bool = False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value: Any) -> bool:
    return _is_int(value) and value > 0


def _path(value: Any) -> bool:
    return isinstance(value, str | os.PathLike) and bool(os.fspath(value))


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


class _Config:
    """Keyword-only fields declared in ``_fields``; validated on construction."""

    _fields: ClassVar[dict[str, _Field]] = {}
    model_config: ClassVar[dict[str, Any]] = {}

    def __init__(self, **values: Any):
        name = type(self).__name__
        unknown = sorted(set(values) - set(self._fields))
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, list(self._fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigValidationError(
                f"{name}: unknown key {key!r}{hint}; accepted keys are {sorted(self._fields)}"
            )
        for key, spec in self._fields.items():
            if key not in values and spec.required:
                raise ConfigValidationError(f"{name}.{key} is required: expected {spec.accepted}")
            value = values.get(key, spec.default)
            if not spec.check(value):
                raise ConfigValidationError(f"{name}.{key}={value!r} is invalid: expected {spec.accepted}")
            object.__setattr__(self, key, value)
        self._validate()

    def _validate(self) -> None:
        """Cross-field rules (subclasses)."""

    def __setattr__(self, key: str, value: Any) -> None:
        """Assignment is validated like construction (an unknown key or a bad value raises)."""
        type(self)(**{**self.model_dump(), key: value})  # raises, naming the field
        object.__setattr__(self, key, value)

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict (for logging or a new config: ``type(c)(**c.model_dump())``)."""
        return {key: getattr(self, key) for key in self._fields}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.model_dump() == self.model_dump()

    __hash__ = None  # mutable, like a pydantic model

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.model_dump().items())
        return f"{type(self).__name__}({body})"


_PATH_OR_NONE = "None or a non-empty path / URI (str or os.PathLike)"


class TrainingIOHandlerConfig(_Config):
    """Pydantic-style config holding all settings relevant for the training IO handler.

    checkpoint_dir:  root checkpoint directory, a local path or any URI scheme orbax's path
                     handling supports; None skips the clear_previous_checkpoints guard. Default None.
    restore_dir:     directory to restore checkpoints from; None: ``checkpoint_dir``.
    max_to_keep:     checkpoints to retain (int > 0). Default 5.
    save_interval_steps: save every N training steps (int > 0); None (the default) disables
                     checkpointing.
    keep_best:       True: keep the ``max_to_keep`` best by eval_loss plus the most recent; False:
                     the most recent ``max_to_keep``. Default True.
    enable_async_checkpointing: write asynchronously. Default False.
    restore_checkpoint_if_exists: restore a previous checkpoint if one exists. Default False.
    step_to_restore: the step to restore (int > 0); None (the default): the latest.
    restore_optimizer_state: also restore the optimizer state. Default True.
    clear_previous_checkpoints: delete previous checkpoints; cannot be True together with a
                     restore (``restore_checkpoint_if_exists`` or ``step_to_restore``). Default False.

    Unknown keys are rejected (``model_config = {'extra': 'forbid'}``).
    """

    model_config: ClassVar[dict[str, Any]] = {"extra": "forbid"}
    _fields: ClassVar[dict[str, _Field]] = {
        "checkpoint_dir": _Field(None, _optional(_path), _PATH_OR_NONE),
        "restore_dir": _Field(None, _optional(_path), _PATH_OR_NONE),
        "max_to_keep": _Field(5, _positive_int, "an int > 0"),
        "save_interval_steps": _Field(
            None, _optional(_positive_int), "None (no checkpointing) or an int > 0"
        ),
        "keep_best": _Field(True, _bool, "a bool"),
        "enable_async_checkpointing": _Field(False, _bool, "a bool"),
        "restore_checkpoint_if_exists": _Field(False, _bool, "a bool"),
        "step_to_restore": _Field(None, _optional(_positive_int), "None (the latest) or an int > 0"),
        "restore_optimizer_state": _Field(True, _bool, "a bool"),
        "clear_previous_checkpoints": _Field(False, _bool, "a bool"),
    }

    checkpoint_dir: str | os.PathLike | None
    restore_dir: str | os.PathLike | None
    max_to_keep: int
    save_interval_steps: int | None
    keep_best: bool
    enable_async_checkpointing: bool
    restore_checkpoint_if_exists: bool
    step_to_restore: int | None
    restore_optimizer_state: bool
    clear_previous_checkpoints: bool

    @property
    def restores(self) -> bool:
        """Whether a restore is requested."""
        return self.restore_checkpoint_if_exists or self.step_to_restore is not None

    def _validate(self) -> None:
        if self.clear_previous_checkpoints and self.restores:
            raise ConfigValidationError(
                "TrainingIOHandlerConfig.clear_previous_checkpoints=True cannot be combined with a restore "
                f"(restore_checkpoint_if_exists={self.restore_checkpoint_if_exists}, "
                f"step_to_restore={self.step_to_restore!r})"
            )


class CheckpointerConfig(_Config):
    """Configuration for ``Checkpointer``.

    checkpoint_dir: directory to write to (required; a path or URI).
    max_to_keep:    checkpoints to retain (int > 0); None disables pruning entirely, the right
                    setting for read-only managers pointed at a foreign directory. Default 5.
    save_interval_steps: save every N training steps (int > 0). Default 100.
    keep_best:      True: keep the best ``max_to_keep`` by eval_loss plus the most recent; False:
                    the most recent ``max_to_keep``. Default True.
    enable_async_checkpointing: write asynchronously. Default False (synchronous, in case of
                    crashes).
    """

    model_config: ClassVar[dict[str, Any]] = {"arbitrary_types_allowed": True}
    _fields: ClassVar[dict[str, _Field]] = {
        "checkpoint_dir": _Field(None, _path, "a non-empty path / URI (str or os.PathLike)", required=True),
        "max_to_keep": _Field(5, _optional(_positive_int), "None (keep all) or an int > 0"),
        "save_interval_steps": _Field(100, _positive_int, "an int > 0"),
        "keep_best": _Field(True, _bool, "a bool"),
        "enable_async_checkpointing": _Field(False, _bool, "a bool"),
    }

    checkpoint_dir: str | os.PathLike
    max_to_keep: int | None
    save_interval_steps: int
    keep_best: bool
    enable_async_checkpointing: bool
