"""Reading experiment configs: ``get_config(arg)`` files plus ``--config.a.b=value`` overrides.

The schema (``dew.schema``; the sections are declared by the code that owns them and assembled
by ``dew.training.trainer.config_schema``) decides which keys exist, their kinds and defaults.
Any mistake, in the file or an override, stops the run before work starts with one message
naming the key (and, for an unknown key, the closest known one).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import ml_collections

from dew.schema import ConfigError


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Load ``path.py`` or ``path.py:arg`` by calling its ``get_config([arg])``.

    A file that does not run (a syntax error, an exception in ``get_config``) is a
    ``ConfigError`` naming the file, the line and the message.
    """
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise ConfigError(f"--config: no config file at {path!r}")
    module_spec = importlib.util.spec_from_file_location(f"_dew_config_{abs(hash(path))}", path)
    if module_spec is None or module_spec.loader is None:  # not a .py file: no loader for it
        raise ConfigError(f"--config: {path} is not a Python file (expected a .py with get_config())")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise ConfigError(f"--config: {path} defines no get_config()")
        config = module.get_config(arg) if arg else module.get_config()
    except ConfigError:
        raise
    except SyntaxError as e:
        raise ConfigError(f"--config: {e.filename or path}, line {e.lineno}: {e.msg}") from None
    except Exception as e:  # the file's own code failed: say where
        raise ConfigError(f"--config: {path}{_where(e, path)}: {type(e).__name__}: {e}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"--config: {path}:get_config() returned {type(config).__name__}, not a ConfigDict")
    return config


def _where(error: BaseException, path: str) -> str:
    """``, line N`` of the innermost frame of ``error`` inside the config file, if any."""
    line = None
    tb = error.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    return "" if line is None else f", line {line}"


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> ml_collections.ConfigDict:
    """The complete config: ``config`` checked against the Trainer's schema, with the
    ``config.a.b=value`` strings (the ``--`` already stripped) parsed as their keys' kinds."""
    from dew.training.trainer import resolve_config

    return resolve_config(config, overrides)


def describe_config(config: ml_collections.ConfigDict, overrides: Sequence[str] = ()) -> str:
    """What ``--help-config`` prints: every key of the Trainer's schema as ``config`` with
    ``overrides`` resolves it, one per line (value, default if different, kind, doc)."""
    from dew.schema import describe, resolve
    from dew.training.trainer import config_schema

    resolved, schema = resolve(config_schema(), config, overrides)
    return describe(schema, resolved)


__all__ = ["ConfigError", "apply_overrides", "describe_config", "load_config"]
