"""JAX's persistent compilation cache: compiled programs reused across runs (compiles dominate a
CPU run's start-up; a repeat compile of a small step takes 0.1 s instead of 1.7 s).

By default the cache is the machine's, shared by every workdir and every command
(``machine_directory``: ``jax`` in ``$DEW_CACHE_DIR``, else ``$XDG_CACHE_HOME/dew``, else
``~/.cache/dew``), so a new workdir starts without
compiling the programs this machine compiled before: a compiled program is a fact about the
program, the XLA flags, the jaxlib and the devices (JAX's cache key), never about one run. It
moves with ``DEW_CACHE_DIR`` or ``config.runtime.compilation_cache=<dir>``, and
``config.runtime.compilation_cache=off`` switches it off; with ``DEW_CACHE_DIR=off`` the default
is ``<workdir>/cache/jax`` (per run, as before the machine's cache); ``JAX_COMPILATION_CACHE_DIR``
wins over everything. JAX bounds nothing by default: delete the folder to reclaim its space.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENVIRONMENT = "JAX_COMPILATION_CACHE_DIR"
#: The machine's cache folder (``off`` or empty: none; per-workdir caches instead).
MACHINE_VARIABLE = "DEW_CACHE_DIR"


def machine_directory(environ: Mapping[str, str] | None = None) -> str | None:
    """The machine's dew cache folder (its compiled programs): ``$DEW_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/dew``, else ``~/.cache/dew``; None for ``DEW_CACHE_DIR=off`` or empty."""
    environ = os.environ if environ is None else environ
    if MACHINE_VARIABLE in environ:
        directory = environ[MACHINE_VARIABLE]
        return None if directory in ("", "off") else directory
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dew")


def cache_directory(
    setting: str, workdir: str | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """Where compiled programs are kept: ``JAX_COMPILATION_CACHE_DIR`` (non-empty) wins, then
    ``setting`` (``config.runtime.compilation_cache``: a directory, ``"off"``, or ``""`` for the
    machine's ``<machine_directory>/jax``, or ``<workdir>/cache/jax`` where the machine's folder
    is off); None when off, or when the default needs a workdir and none is given."""
    environ = os.environ if environ is None else environ
    if environ.get(ENVIRONMENT):
        return environ[ENVIRONMENT]
    if setting == "off":
        return None
    if setting:
        return setting
    machine = machine_directory(environ)
    if machine is not None:
        return os.path.join(machine, "jax")
    return None if workdir is None else os.path.join(workdir, "cache", "jax")


def enable_compilation_cache(directory: str) -> None:
    """Keep every compiled program of this process under ``directory`` (whatever its compile took)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


__all__ = ["cache_directory", "enable_compilation_cache", "machine_directory"]
