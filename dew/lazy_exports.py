"""A package's names resolved on first use (PEP 562): the one ``__getattr__`` / ``__dir__`` pair
that ``dew``, ``dew.training`` and ``dew.checkpointing`` install over their export tables.

A package keeps three things in step, each checked by ``tests/test_types.py``: its ``_EXPORTS``
table (name -> the module that defines it, what runs), the same names imported under
``if TYPE_CHECKING:`` (what a type checker reads) and a literal ``__all__``. This module imports
nothing of dew and nothing heavy, so installing it opens no backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def lazy_exports(
    namespace: MutableMapping[str, Any],
    exports: Mapping[str, str],
    *,
    before: Callable[[], None] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``(__getattr__, __dir__)`` over ``exports`` (name -> module).

    ``namespace`` is the package's ``globals()``: a name is imported from its module on first
    use and stored there, so the next lookup never reaches ``__getattr__``. ``before`` runs before
    each first resolution (``dew`` fills its registries there). A name outside ``exports`` is the
    ``AttributeError`` Python's own lookup would raise, naming the package."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before()
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
