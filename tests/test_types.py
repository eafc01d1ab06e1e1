"""The lazy export tables stay visible to the type checker: in each package that resolves names
lazily (PEP 562 ``__getattr__`` over ``_EXPORTS``), the ``if TYPE_CHECKING:`` imports name
exactly the entries of ``_EXPORTS`` (each from the module the table names) and ``__all__`` is a
literal list of exactly those names. Read from the source (AST), so nothing is imported."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAZY_PACKAGES = (
    "dew/__init__.py",
    "dew/training/__init__.py",
    "dew/checkpointing/__init__.py",
    "dew/runtime/__init__.py",
)


def _module_assignment(tree: ast.Module, name: str) -> ast.expr:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            assert isinstance(node, ast.Assign)
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            assert node.value is not None, f"{name} is declared without a value"
            return node.value
    raise AssertionError(f"no module-level assignment to {name}")


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """name -> module of every ``from m import n`` under a module-level ``if TYPE_CHECKING:``."""
    found: dict[str, str] = {}
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    ]
    assert blocks, "no module-level `if TYPE_CHECKING:` block"
    for block in blocks:
        for node in block.body:
            assert isinstance(node, ast.ImportFrom) and node.level == 0 and node.module, ast.unparse(node)
            for alias in node.names:
                assert alias.asname is None, f"{ast.unparse(node)}: a lazy name is imported as itself"
                assert alias.name not in found, f"{alias.name} is imported twice"
                found[alias.name] = node.module
    return found


def _lazy_tables(relative: str) -> tuple[dict[str, str], dict[str, str], ast.expr]:
    tree = ast.parse((ROOT / relative).read_text(), relative)
    exports = ast.literal_eval(_module_assignment(tree, "_EXPORTS"))
    return exports, _type_checking_imports(tree), _module_assignment(tree, "__all__")


@pytest.mark.parametrize("relative", LAZY_PACKAGES)
def test_type_checking_imports_name_exactly_the_lazy_exports(relative):
    exports, imported, _ = _lazy_tables(relative)
    assert imported == exports


@pytest.mark.parametrize("relative", LAZY_PACKAGES)
def test_all_is_a_literal_list_of_exactly_the_lazy_exports(relative):
    exports, _, all_node = _lazy_tables(relative)
    # A literal (not ``sorted(_EXPORTS)``): type checkers only read literal ``__all__`` lists.
    assert isinstance(all_node, (ast.List, ast.Tuple)), ast.unparse(all_node)
    names = ast.literal_eval(all_node)
    assert len(names) == len(set(names)), "__all__ names a symbol twice"
    assert set(names) == set(exports)


def test_the_tables_are_read_from_the_source():
    """The check reads real tables: a package's export table is not empty and names the
    package's well-known entries."""
    exports, imported, _ = _lazy_tables("dew/__init__.py")
    assert exports["Trainer"] == "dew.training.trainer" == imported["Trainer"]
    training, _, _ = _lazy_tables("dew/training/__init__.py")
    assert training["fit"] == "dew.training.loop"


def test_a_config_file_python_cannot_load_is_one_config_error(tmp_path):
    """Found by the type checker: importlib finds no loader for a file that is not ``.py``
    (``spec_from_file_location`` returns None), which used to surface as an AttributeError."""
    from dew.config import ConfigError, load_config

    path = tmp_path / "experiment.txt"
    path.write_text("def get_config():\n    return None\n")
    with pytest.raises(ConfigError, match=r"--config: .*experiment.txt is not a Python file"):
        load_config(str(path))
