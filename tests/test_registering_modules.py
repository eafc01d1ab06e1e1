"""The registries are filled by importing every module that registers
(``dew._REGISTERING_MODULES``): a module that calls ``registry.<kind>.register`` but is missing
from that list would leave its names silently unregistered, and a listed module that registers
nothing is dead weight. This test reads every module of the package (its syntax tree, nothing
imported) and holds the list to what the code does."""

from __future__ import annotations

import pathlib

from helpers_registering import registering_modules

import dew

PACKAGE = pathlib.Path(dew.__file__).parent


def test_every_module_that_registers_is_imported_to_fill_the_registries():
    listed = set(dew._REGISTERING_MODULES)
    found = registering_modules(PACKAGE)
    assert found - listed == set(), (
        f"registering modules missing from dew._REGISTERING_MODULES: {found - listed}"
    )
    assert listed - found == set(), f"listed modules that register nothing: {listed - found}"


def test_the_scan_finds_a_registration_written_either_way(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "called.py").write_text('registry.models.register("a", object)\n')
    (package / "decorated.py").write_text('@registry.metrics.register("b")\ndef b():\n    pass\n')
    (package / "plain.py").write_text("def register():\n    pass\nregister()\n")
    assert registering_modules(package) == {"pkg.called", "pkg.decorated"}
