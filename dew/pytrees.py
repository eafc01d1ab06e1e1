"""Naming a pytree's leaves: one spelling of a leaf's key path, shared by everything that shows
or matches parameter names (EMA tracking patterns, sharding rules, the parameter table)."""

from __future__ import annotations

from typing import Any


def leaf_path(path: tuple[Any, ...]) -> str:
    """A pytree key path as ``"a/b/c"``: dict keys, attribute names and sequence indices (haiku's
    ``{module: {name: array}}`` reads ``module/name``)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


__all__ = ["leaf_path"]
