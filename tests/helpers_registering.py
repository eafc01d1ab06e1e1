"""Which modules of a package fill a registry: read from their syntax trees, nothing imported.
Shared by tests/test_registering_modules.py and tests/test_architecture.py."""

from __future__ import annotations

import ast
import pathlib


def registers(tree: ast.AST) -> bool:
    """Whether the module calls ``registry.<kind>.register(...)`` (as a call or a decorator)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "register"
            and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name)
            and func.value.value.id == "registry"
        ):
            return True
    return False


def registering_modules(root: pathlib.Path) -> set[str]:
    """The dotted names of the modules under the package ``root`` that register (the registry
    module ``root/registry.py`` itself left out)."""
    found = set()
    for path in root.rglob("*.py"):
        if path.name == "registry.py" and path.parent == root:
            continue  # the registries themselves
        if registers(ast.parse(path.read_text(), str(path))):
            relative = path.relative_to(root.parent).with_suffix("")
            found.add(".".join(relative.parts))
    return found


def listed_registering_modules(init: pathlib.Path) -> tuple[str, ...]:
    """The literal ``_REGISTERING_MODULES`` of a package's ``__init__.py``, read from its source."""
    tree = ast.parse(init.read_text(), str(init))
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_REGISTERING_MODULES" for t in targets):
                assert node.value is not None
                return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"{init} assigns no _REGISTERING_MODULES")


def registry_fill_gaps(listed: tuple[str, ...], found: set[str]) -> list[str]:
    """One line per disagreement between the fill list and what the code registers."""
    return [
        f"{m} registers but is missing from dew._REGISTERING_MODULES" for m in sorted(found - set(listed))
    ] + [
        f"{m} is listed in dew._REGISTERING_MODULES but registers nothing"
        for m in sorted(set(listed) - found)
    ]
