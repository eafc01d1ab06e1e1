"""Exported names whose capability is not built yet: they resolve, and using one raises
``NotImplementedError`` naming the missing piece. Never a silent stand-in."""

from __future__ import annotations

from typing import Any, NoReturn


def unbuilt_class(name: str, doc: str, missing: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"{name} is not built yet: {missing}")

    return type(name, (), {"__init__": __init__, "__doc__": doc})


def unbuilt_function(name: str, doc: str, missing: str):
    def function(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"{name} is not built yet: {missing}")

    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc
    return function
