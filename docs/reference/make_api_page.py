"""Writes docs/api.md, the API reference page, from the package's own export tables.

The page lists every name ``dew`` and ``dew.training`` export (their ``_EXPORTS`` tables, the
same surface the API reference text describes), each rendered by mkdocstrings from the
docstring where it is defined. ``tests/system/test_docs.py`` checks that the page is current.

    python docs/reference/make_api_page.py        # rewrite docs/api.md
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"

HEADER = """# API reference

Rendered from the docstrings. `dew` exports the names in the first part (each resolves lazily:
`import dew` opens no JAX backend); `dew.training` adds the trainer's pieces and the stix
checkpointing and logging names in the second. Regenerate this page with
`python docs/reference/make_api_page.py` after changing an export table.
"""


def exports(module_file: pathlib.Path) -> dict[str, str]:
    """The ``_EXPORTS`` table of a package ``__init__``, read without importing it."""
    tree = ast.parse(module_file.read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign):
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "_EXPORTS":
            return ast.literal_eval(node.value)
    raise ValueError(f"{module_file} has no _EXPORTS table")


def page() -> str:
    """The page's text."""
    parts = [HEADER]
    top = exports(ROOT / "dew" / "__init__.py")
    training = exports(ROOT / "dew" / "training" / "__init__.py")
    sections = (
        ("dew", top),
        ("dew.training", {k: v for k, v in training.items() if top.get(k) != v}),
    )
    for package, table in sections:
        parts.append(f"\n## `{package}`\n")
        for name in sorted(table, key=str.lower):
            parts.append(f"\n### `{package}.{name}`\n\n::: {table[name]}.{name}\n")
    return "".join(parts)


if __name__ == "__main__":
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(ROOT)}")
