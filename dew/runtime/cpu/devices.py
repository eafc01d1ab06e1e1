"""One XLA device per CPU core, so that a step's data-parallel axis puts every core to work.

On a CPU host XLA runs one program per device. Its convolution and matmul library calls spread
over the cores, but the rest of a step (group norms, activations, the optimizer and EMA updates,
layout copies) runs on the device's one thread, so a single device leaves cores idle for much of
a convolutional step. Presenting one device per core and splitting each batch over them (the
mesh's data axis, as on any multi-device machine) keeps them all busy: the 16x16 EDM U-Net's
train step runs 1.23x faster on two cores (``benchmarks/RESULTS.md``).

The device count is an XLA flag read once, when JAX starts its CPU backend, so it must be set
before anything touches a device: ``dew.runtime.cpu.setup`` presents ``config.runtime.host_devices``
(``python -m dew.main`` calls it before building the Trainer, and so does a script that builds
its own); ``XLA_FLAGS`` naming a count wins. It affects only the CPU platform: on a machine
with accelerators the default devices are unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from dew.runtime.backend import backend_started

FLAG = "--xla_force_host_platform_device_count"


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def host_device_count(requested: int, batch_sizes: Iterable[int], cores: int | None = None) -> int:
    """How many CPU devices to present: ``requested`` when > 0, else the largest count up to
    ``cores`` (default: ``cpu_cores()``) that divides every batch size, so that the automatic
    choice never makes a config's batch unsplittable (an explicit request that does is
    reported by the Trainer's batch check, naming the field)."""
    if requested > 0:
        return requested
    sizes = [int(b) for b in batch_sizes]
    for count in range(cores or cpu_cores(), 1, -1):
        if all(size % count == 0 for size in sizes):
            return count
    return 1


def flagged_count(xla_flags: str) -> int | None:
    """The device count ``XLA_FLAGS`` already sets, or None."""
    found = re.findall(rf"{FLAG}=(\d+)", xla_flags)
    return int(found[-1]) if found else None


def present_host_devices(count: int) -> int | None:
    """Make JAX's CPU platform present ``count`` devices by adding the flag to ``XLA_FLAGS``.

    Returns ``count`` when the flag was added; None when it was left alone: ``XLA_FLAGS``
    already sets a count (the user's choice wins), or JAX's backend has already started (the
    flag could no longer take effect; the devices stay as they are).
    """
    if count < 1:
        raise ValueError(f"present_host_devices: count must be an int >= 1, got {count!r}")
    flags = os.environ.get("XLA_FLAGS", "")
    if flagged_count(flags) is not None or backend_started():
        return None
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}={count}".strip()
    return count
