"""The documentation: the site builds with warnings as errors, the API reference page lists what
the package exports, and the README stays a front door."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _api_page_module():
    spec = importlib.util.spec_from_file_location("make_api_page", ROOT / "docs/reference/make_api_page.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    # mkdocstrings rendered the docstrings, not just the headings.
    assert "Runs an Objective" in api and "Hold everything a run must checkpoint" in api


def test_the_api_page_is_current_and_lists_every_export():
    module = _api_page_module()
    assert (ROOT / "docs" / "api.md").read_text() == module.page(), (
        "docs/api.md is stale: run python docs/reference/make_api_page.py"
    )
    import dew
    import dew.training

    page = module.page()
    for name in dew.__all__:
        assert f"### `dew.{name}`" in page, name
    for name in dew.training._EXPORTS:
        assert f"### `dew.{name}`" in page or f"### `dew.training.{name}`" in page, name


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    listed = set(re.findall(r":\s*(\S+\.md)\s*$", nav, re.M))
    assert pages == listed, (pages - listed, listed - pages)


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


def test_no_tracker_issue_numbers_in_the_project():
    """Code, docs and records say what a thing does, never which tracker issue asked for it."""
    import subprocess as sp

    files = sp.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"\bissue[ -]?#?\d+\b", re.IGNORECASE)
    kinds = (".py", ".md", ".yml", ".toml", ".txt", "Makefile")
    found = []
    for name in files:
        if not name.endswith(kinds) or name == "tests/test_docs.py":
            continue
        for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{name}:{number}: {line.strip()[:80]}")
    assert not found, "\n".join(found)
