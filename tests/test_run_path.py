"""The path a reader follows from ``python -m dew.main`` to the jitted step, as
``docs/architecture.md`` lists it ("From ``python -m dew.main`` to the jitted step"): at most six
files, the first ``dew/main.py``, each existing, each importing the next and calling a name it
imports from it (function-level imports count), the last defining ``step_program``, the step that
``Programs`` jits (the public ``make_step`` builds it too). The page cannot drift from the code
unnoticed."""

from __future__ import annotations

import ast
import itertools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADING = "### From `python -m dew.main` to the jitted step"


def listed_path() -> list[str]:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert HEADING in page, f"docs/architecture.md has no section {HEADING!r}"
    section = page.split(HEADING, 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\d+\. `(dew/[\w/]+\.py)`", section, flags=re.MULTILINE)


def module_of(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def names_imported_from(tree: ast.AST, module: str) -> set[str]:
    """The local names ``tree`` binds to ``module`` or to what it imports from it."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.asname or alias.name for alias in node.names if alias.name == module)
    return names


def called_names(tree: ast.AST) -> set[str]:
    """Every name called in ``tree``: ``f(...)`` gives ``f``, ``m.f(...)`` gives ``m``."""
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            while isinstance(func, ast.Attribute):
                func = func.value
            if isinstance(func, ast.Name):
                called.add(func.id)
    return called


def test_the_page_lists_a_short_path_from_main():
    path = listed_path()
    assert path[:1] == ["dew/main.py"], path
    assert 2 <= len(path) <= 6, path
    assert len(set(path)) == len(path), path


def test_each_file_on_the_path_exists_and_calls_into_the_next():
    path = listed_path()
    for here, there in itertools.pairwise(path):
        assert (ROOT / here).is_file(), f"{here} is listed but does not exist"
        assert (ROOT / there).is_file(), f"{there} is listed but does not exist"
        tree = ast.parse((ROOT / here).read_text())
        imported = names_imported_from(tree, module_of(there))
        assert imported, f"{here} does not import {module_of(there)}"
        assert imported & called_names(tree), f"{here} imports {sorted(imported)} but calls none of them"


def test_the_path_ends_at_the_step_programs_jits():
    path = listed_path()
    last = ast.parse((ROOT / path[-1]).read_text())
    defined = {n.name for n in ast.walk(last) if isinstance(n, ast.FunctionDef)}
    assert {"step_program", "make_step"} <= defined, path[-1]
    programs = ast.parse((ROOT / "dew" / "training" / "programs.py").read_text())
    assert "step_program" in names_imported_from(programs, module_of(path[-1]))
