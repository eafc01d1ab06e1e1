"""The process and the platform it runs on: everything decided once per process, before or as
JAX starts, and nothing that a traced program computes.

- ``host_devices``: how many XLA CPU devices a CPU host presents (one per core by default);
- ``cpu_convolutions``: which library XLA:CPU runs convolutions with;
- ``kernel_choice``: the convolution library and weight gradients, timed on this machine;
  ``dot_choice``: where a transformer's dots go (XLA's default or oneDNN), timed the same way;
  ``kernel_cache``: their cache files (the workdir's, the machine's), read as hints;
- ``host_memory``: glibc's transparent-huge-page tunable for XLA:CPU's per-step buffers;
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
