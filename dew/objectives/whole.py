"""Objectives built whole by their constructors: ``BuiltWhole``, the metaclass of dew's objectives.

An objective's attributes are the constructor's arguments and what it derives from them; once the
outermost constructor returns (a subclass's, after its ``super().__init__``), assigning or
deleting an attribute raises ``AttributeError``. ``from_config`` therefore computes the
constructor's arguments and calls it, and nothing assembles an objective afterwards. State a
method keeps between calls (a table of jitted functions, what a preview leaves for its scoring)
is an object the constructor makes and methods use, never an attribute replaced.
"""

from __future__ import annotations

import abc
from typing import Any

_BUILT = "_built_whole"


class BuiltWhole(abc.ABCMeta):
    """Seals each instance when its construction returns (see the module docstring)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__call__(*args, **kwargs)
        object.__setattr__(instance, _BUILT, True)
        return instance

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any):
        if not any(isinstance(base, BuiltWhole) for base in bases):  # the first class of a family
            namespace.setdefault("__setattr__", _refuse_after_construction)
            namespace.setdefault("__delattr__", _refuse_delete_after_construction)
        return super().__new__(mcs, name, bases, namespace, **kwargs)


def _refuse_after_construction(self: Any, name: str, value: Any) -> None:
    if self.__dict__.get(_BUILT, False):
        raise AttributeError(
            f"{type(self).__name__}.{name} cannot be set: the objective is built whole by its "
            f"constructor; pass {name} to it (from_config computes the constructor's arguments)"
        )
    object.__setattr__(self, name, value)


def _refuse_delete_after_construction(self: Any, name: str) -> None:
    if self.__dict__.get(_BUILT, False):
        raise AttributeError(f"{type(self).__name__}.{name} cannot be deleted: the objective is built whole")
    object.__delattr__(self, name)


__all__ = ["BuiltWhole"]
