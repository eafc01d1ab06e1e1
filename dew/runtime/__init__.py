"""The process and the platform it runs on: everything decided once per process, before or as
JAX starts, and nothing that a traced program computes.

- ``backend``: which backend JAX will start, known before it starts;
- ``cpu``: the CPU platform, entered only where that backend is the CPU (one device per core,
  glibc's malloc keeping a step's freed memory, the kernel choice by the CPU-flag rule; dots XLA's);
- ``compilation_cache``: JAX's persistent compilation cache (the machine's, by default);
- ``precompile``: compiling a jitted program from abstract arguments in a background thread;
- ``workdir_lock``: one live run per working directory;
- ``distributed``: joining the process group of a multi-process run (flags, ``DEW_*`` variables
  or a cluster JAX detects: ``cluster_detection``) through JAX's distributed runtime;
  ``heartbeats``: the joined processes in step (their configs agreed, heartbeats watched,
  leaving, barriers);
- ``platform``: ``start``, the one call a command or a user's script makes before JAX starts,
  the ``Platform`` it returns and the ``config.runtime`` section it reads.

Layers above receive the platform's choices (``dew.kernels``); they never detect them. Names
resolve lazily, so importing the package opens no backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {"start": "dew.runtime.platform", "Platform": "dew.runtime.platform"}

if TYPE_CHECKING:  # the lazy names, visible to type checkers (tests/test_types.py keeps them in step)
    from dew.runtime.platform import Platform, start


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dew.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["Platform", "start"]
