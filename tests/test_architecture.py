"""The package's layering, read from its own imports (``docs/architecture.md`` is the page it
checks): every ``import`` in ``dew/``, function-level ones included (those under
``if TYPE_CHECKING:`` never run and are left out), is parsed; each module
belongs to the unit of ``UNITS`` with the longest matching name; an import may only go down the
layers, stay inside its unit, or take one of the sideways edges the page names; no modality
imports the trainer core. No module-level and no unit-level import circle. No module is over
``MAX_LINES`` lines (but the shrinking allowlist ``OVERSIZED``), and every module that registers is
named in the registry fill ``dew._REGISTERING_MODULES``."""

from __future__ import annotations

import ast
import pathlib

import pytest
from helpers_registering import listed_registering_modules, registering_modules, registry_fill_gaps

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dew"

# unit -> layer (lower imports nothing above it). Kept in step with docs/architecture.md.
CORE, CONTRACTS, FOUNDATION, SERVICES, TRAINER, MODALITIES, ENTRY = range(7)
UNITS: dict[str, int] = {
    "dew": CORE,  # the package itself: lazy exports and the registry fill, by name only
    "dew.registry": CORE,
    "dew.schema": CORE,
    "dew.inputs": CORE,
    "dew.artifacts": CORE,
    "dew.kernels": CORE,
    "dew.pytrees": CORE,
    "dew.contracts": CONTRACTS,  # TrainState, Objective, Step, Aux: below the trainer and checkpointing
    "dew.runtime": FOUNDATION,
    "dew.averaging": FOUNDATION,
    "dew.data": FOUNDATION,
    "dew.telemetry": FOUNDATION,
    "dew.run_records": FOUNDATION,  # run.json and the run's other records, not a checkpoint's
    "dew.checkpointing": SERVICES,
    "dew.tracking": SERVICES,
    "dew.training": TRAINER,
    "dew.diffusion": MODALITIES,
    "dew.sampling": MODALITIES,
    "dew.objectives": MODALITIES,
    "dew.networks": MODALITIES,
    "dew.encoding": MODALITIES,
    "dew.scoring": MODALITIES,
    "dew.augment": MODALITIES,
    "dew.interop": MODALITIES,
    "dew.data.sources": MODALITIES,
    "dew.config": ENTRY,  # experiment files resolved against the whole schema the Trainer assembles
    "dew.failures": ENTRY,
    "dew.inference": ENTRY,
    "dew.main": ENTRY,
    "dew.launch": ENTRY,  # the run python -m dew.main makes: workdir, platform, lock, console lines
    "dew.sample": ENTRY,
    "dew.fid": ENTRY,
    "dew.phema": ENTRY,
    "dew.sweep": ENTRY,
    "dew.convert_edm": ENTRY,
    "dew.convert_dit": ENTRY,
    "dew.converted_run": ENTRY,  # what convert_edm and convert_dit share: the run they write
}

# Layers whose packages stand apart: one of them imports another of the same layer only along an
# edge of SIDEWAYS. In the other layers a module may use a sibling unit (circles are caught below).
INDEPENDENT = {FOUNDATION, SERVICES}

# Imports between two units of one layer that the architecture page names.
SIDEWAYS = {
    ("dew.checkpointing", "dew.tracking"),  # the stix TrainingIOHandler logs as well as saves
}

# What a modality shares with the trainer core lives below both (dew.contracts.precision,
# dew.data.splits): a modality importing the trainer would make every objective a trainer client.
FORBIDDEN_BELOW = {MODALITIES: {"dew.training"}}

# One idea per module: no file of dew/ is longer than this.
MAX_LINES = 420

# The modules allowed past MAX_LINES: none any more. Never add one; split the module by idea.
OVERSIZED: set[str] = set()

# What the trainer core may use of the services: their public modules, never a backend.
TRAINER_MAY_USE = {
    "dew.checkpointing": {
        "dew.checkpointing.checkpoints",
        "dew.checkpointing.errors",
        "dew.checkpointing.settings",
        "dew.checkpointing.restore",
    },
    "dew.tracking": {
        "dew.tracking.trackers",
        "dew.tracking.console",
        "dew.tracking.base",
        "dew.tracking.media",
    },
}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def is_type_checking_block(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports a type checker reads and
    Python never runs (the lazy export tables), so no edge of the import graph."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def run_time_nodes(tree: ast.AST):
    """Every node of ``tree`` outside the bodies of ``if TYPE_CHECKING:`` blocks (their ``else``
    branches run, so they are kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and is_type_checking_block(node):
            stack.extend([node.test, *node.orelse])
        else:
            stack.extend(ast.iter_child_nodes(node))


def imports_of(path: pathlib.Path) -> set[str]:
    """The dew modules ``path`` imports, at any depth of the file: ``from dew.x import y`` is an
    import of ``dew.x.y`` when that is a module, else of ``dew.x``. Imports under
    ``if TYPE_CHECKING:`` are for the type checker only and never run, so they are no edge."""
    found = set()
    for node in run_time_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "dew")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "dew":
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if is_module(full) else node.module)
    return found


def unit_of(module: str) -> str:
    candidates = [u for u in UNITS if module == u or module.startswith(u + ".")]
    assert candidates, f"{module} belongs to no unit of docs/architecture.md: add it to the page and UNITS"
    return max(candidates, key=len)


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def violations(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in edges.items():
        a = unit_of(module)
        for target in sorted(targets):
            b = unit_of(target)
            if a == b or (a, b) in SIDEWAYS:
                continue
            if b in FORBIDDEN_BELOW.get(UNITS[a], ()):
                found.append(f"{module} ({a}, a modality) imports {target}: the trainer core")
                continue
            if UNITS[b] > UNITS[a] or (UNITS[b] == UNITS[a] and UNITS[a] in INDEPENDENT):
                found.append(f"{module} ({a}, layer {UNITS[a]}) imports {target} ({b}, layer {UNITS[b]})")
            elif a == "dew.training" and b in TRAINER_MAY_USE and target not in TRAINER_MAY_USE[b]:
                found.append(f"{module} (trainer core) imports {target}, not a public module of {b}")
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def unit_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for module, targets in edges.items():
        a = unit_of(module)
        units.setdefault(a, set()).update(b for b in map(unit_of, targets) if b != a)
    return units


def without_package_init(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``from dew import registry`` names ``dew.registry``; the bare package ``dew`` (lazy
    exports) is no edge of the graph."""
    return {m: {t for t in ts if t != "dew"} for m, ts in edges.items()}


def oversized(root: pathlib.Path, allowed: set[str]) -> list[str]:
    """``path: N lines`` for each ``.py`` under ``root/dew`` longer than ``MAX_LINES`` and not in
    ``allowed`` (paths relative to ``root``)."""
    found = []
    for path in sorted((root / "dew").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and relative not in allowed:
            found.append(f"{relative}: {lines} lines (over {MAX_LINES}: split it by idea)")
    return found


def test_every_import_follows_the_layers():
    assert violations(without_package_init(graph())) == []


def test_no_module_imports_in_a_circle():
    assert circles(without_package_init(graph())) == []


def test_no_unit_imports_in_a_circle():
    assert circles(unit_graph(without_package_init(graph()))) == []


def test_the_checkpointing_package_names_every_module_it_holds():
    """The package docstring's list (``- ``name``: ...``) is its table of contents."""
    package = PACKAGE / "checkpointing"
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert [m for m in modules if f"``{m}``" not in doc] == []


def test_no_module_is_over_the_line_limit():
    assert oversized(ROOT, OVERSIZED) == []


def test_the_line_limit_catches_a_long_module(tmp_path):
    (tmp_path / "dew" / "x").mkdir(parents=True)
    (tmp_path / "dew" / "x" / "long.py").write_text("pass\n" * (MAX_LINES + 1))
    (tmp_path / "dew" / "x" / "short.py").write_text("pass\n" * MAX_LINES)
    assert oversized(tmp_path, set()) == [
        f"dew/x/long.py: {MAX_LINES + 1} lines (over {MAX_LINES}: split it by idea)"
    ]
    assert oversized(tmp_path, {"dew/x/long.py"}) == []


def test_every_registering_module_is_in_the_registry_fill():
    listed = listed_registering_modules(PACKAGE / "__init__.py")
    assert registry_fill_gaps(listed, registering_modules(PACKAGE)) == []


def test_the_registry_fill_check_catches_a_missing_module(tmp_path):
    package = tmp_path / "dew"
    package.mkdir()
    (package / "__init__.py").write_text('_REGISTERING_MODULES = ("dew.a", "dew.gone")\n')
    (package / "a.py").write_text('registry.models.register("a", object)\n')
    (package / "b.py").write_text('registry.samplers.register("b", object)\n')
    gaps = registry_fill_gaps(
        listed_registering_modules(package / "__init__.py"), registering_modules(package)
    )
    assert gaps == [
        "dew.b registers but is missing from dew._REGISTERING_MODULES",
        "dew.gone is listed in dew._REGISTERING_MODULES but registers nothing",
    ]


def test_the_architecture_page_names_every_unit():
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = [u for u in UNITS if u != "dew" and f"`{u}`" not in page]
    assert missing == []


@pytest.mark.parametrize(
    "edges, expected",
    [
        (
            {"dew.schema": {"dew.training.trainer"}},
            "dew.schema (dew.schema, layer 0) imports dew.training.trainer",
        ),
        ({"dew.networks.x": {"dew.runtime.cpu.flags"}}, None),  # down: allowed
        ({"dew.training.loop": {"dew.tracking.wandb"}}, "not a public module of dew.tracking"),
        ({"dew.data.sources.x": {"dew.main"}}, "imports dew.main (dew.main, layer 6)"),
        ({"dew.checkpointing.x": {"dew.runtime.y", "dew.tracking.base"}}, None),
        ({"dew.checkpointing.x": {"dew.contracts.state"}}, None),  # the contracts sit below
        (  # the trainer's spelling of a contract is the trainer's: checkpointing may not use it
            {"dew.checkpointing.x": {"dew.training.state"}},
            "imports dew.training.state (dew.training, layer 4)",
        ),
        (
            {"dew.averaging.x": {"dew.training.objective"}},
            "imports dew.training.objective (dew.training, layer 4)",
        ),
        (  # an objective reads the compute dtype from the contracts, not from the trainer
            {"dew.objectives.x": {"dew.training.precision"}},
            "dew.objectives.x (dew.objectives, a modality) imports dew.training.precision: the trainer core",
        ),
        ({"dew.data.sources.x": {"dew.training.build"}}, "a modality) imports dew.training.build"),
        ({"dew.objectives.x": {"dew.contracts.precision", "dew.data.splits"}}, None),
        ({"dew.main": {"dew.training.trainer", "dew.objectives.x"}}, None),  # the entry layer may
    ],
)
def test_the_rules_catch_a_broken_import(edges, expected):
    found = violations(edges)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0]


def test_the_circle_finder_finds_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
