"""Which backend JAX will start, known before it starts: decides whether the CPU-only set-up runs.

The CPU platform (``dew.runtime.cpu``: the host device split, glibc's malloc tuning, the
kernel choice) changes nothing, or harms, on an accelerator: it is entered only where
``cpu_backend_expected`` holds. ``describe_devices`` is the line a run
prints once the backend is up.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

#: The modules whose presence means JAX will pick an accelerator when nothing names a platform.
ACCELERATOR_PLUGINS = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "libtpu")


def cpu_backend_expected(environ: Mapping[str, str] | None = None) -> bool:
    """Whether JAX will run on the CPU: ``JAX_PLATFORMS`` (or ``JAX_PLATFORM_NAME``) names cpu
    first, or neither is set and no accelerator plugin is installed."""
    environ = os.environ if environ is None else environ
    named = environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME") or ""
    if named.strip():
        return named.split(",")[0].strip().lower() == "cpu"
    return not any(importlib.util.find_spec(name) is not None for name in ACCELERATOR_PLUGINS)


def expected_platform(environ: Mapping[str, str] | None = None) -> str:
    """The platform JAX will start: the first of ``JAX_PLATFORMS`` (or ``JAX_PLATFORM_NAME``)
    when set, else ``tpu`` where libtpu is installed, ``gpu`` where a CUDA or ROCm plugin is,
    else ``cpu``."""
    environ = os.environ if environ is None else environ
    named = environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME") or ""
    if named.strip():
        first = named.split(",")[0].strip().lower()
        return "gpu" if first in ("cuda", "rocm") else first
    if importlib.util.find_spec("libtpu") is not None:
        return "tpu"
    return "cpu" if cpu_backend_expected(environ) else "gpu"


def backend_started() -> bool:
    """Whether JAX has started its backends (after which XLA flags no longer take effect)."""
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def describe_devices(devices: list[Any] | None = None) -> str:
    """``platform: 1 × TPU v5 lite (tpu), jax 0.10.2``: the devices this process drives, by kind,
    and the JAX version (starts the backend when it has not started)."""
    import jax

    devices = jax.local_devices() if devices is None else devices
    kinds: dict[str, int] = {}
    for device in devices:
        kinds[device.device_kind] = kinds.get(device.device_kind, 0) + 1
    platform = devices[0].platform if devices else "none"
    shown = ", ".join(f"{count} × {kind}" for kind, count in kinds.items())
    return f"platform: {shown} ({platform}), jax {jax.__version__}"


__all__ = [
    "ACCELERATOR_PLUGINS",
    "backend_started",
    "cpu_backend_expected",
    "describe_devices",
    "expected_platform",
]
