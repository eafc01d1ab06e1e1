"""Reading experiment configs: ``get_config(arg)`` files plus ``--config.a.b=value`` overrides.

The config file's own values fix the schema: an override must name an existing key and parse as
that key's type. Any mistake stops the run before work starts, with the key in the message.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
from collections.abc import Sequence
from typing import Any

import ml_collections


class ConfigError(ValueError):
    """A config file, key or value that cannot be used; the message names the key."""


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Load ``path.py`` or ``path.py:arg`` by calling its ``get_config([arg])``."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise ConfigError(f"--config: no config file at {path!r}")
    module_spec = importlib.util.spec_from_file_location(f"_dew_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"--config: {path} defines no get_config()")
    config = module.get_config(arg) if arg else module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"--config: {path}:get_config() returned {type(config).__name__}, not a ConfigDict")
    return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> ml_collections.ConfigDict:
    """Apply ``config.a.b=value`` strings (the ``--`` already stripped), type-checked."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.startswith("config."):
            raise ConfigError(f"cannot read override {item!r}: expected --config.<key>=<value>")
        path = key[len("config.") :].split(".")
        node = config
        for depth, part in enumerate(path):
            here = ".".join(path[: depth + 1])
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                known = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
                close = difflib.get_close_matches(part, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"unknown config key 'config.{here}': known keys there are {sorted(known)}{hint}"
                )
            if depth < len(path) - 1:
                node = node[part]
        current = node[path[-1]]
        with node.unlocked():
            node[path[-1]] = parse_value(f"config.{'.'.join(path)}", text, current)
    return config


def parse_value(key: str, text: str, current: Any) -> Any:
    """Parse ``text`` as the type of ``current``; the config file's value is the schema."""

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{key}={text!r}: expected {expected} (the config's value is {current!r})")

    if isinstance(current, ml_collections.ConfigDict):
        raise fail("a sub-key such as " + key + ".<name>, not a value")
    if isinstance(current, bool):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise fail("a bool (true/false)")
    if isinstance(current, int):
        try:
            return int(text)
        except ValueError:
            raise fail("an int") from None
    if isinstance(current, float):
        try:
            return float(text)
        except ValueError:
            raise fail("a float") from None
    if isinstance(current, str):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if current is None:
            return text
        raise fail(f"a Python literal of type {type(current).__name__}") from None
    if isinstance(current, tuple | list):
        if not isinstance(value, tuple | list):
            value = (value,)
        if current and not all(isinstance(v, type(current[0])) for v in value):
            raise fail(f"a sequence of {type(current[0]).__name__}")
        return type(current)(value)
    return value
