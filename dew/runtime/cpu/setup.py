"""``set_up``: the one entry into the CPU platform, made by ``dew.runtime.start`` only where the
backend will be the CPU (``dew.runtime.backend.cpu_backend_expected``), before JAX starts.

In order: one XLA device per core (``devices``; as many as the batch sizes divide), glibc keeping
a step's freed memory for the next one (the tunables the process started with, else
``memory.reuse_freed_memory`` before XLA's threads exist), the kernel decision
(``choice.choose``: forced, recorded or the CPU-flag rule) and the convolution library it sets
in ``XLA_FLAGS`` (``flags``). Dots stay XLA's. Called after the
backend started, it changes no device setting (XLA read its flags already) and keeps the rule's
kernels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dew import kernels
from dew.runtime.cpu import choice, devices, flags, memory


@dataclasses.dataclass(frozen=True)
class CpuSetup:
    """What ``set_up`` chose: the devices it presented (None: left as they were), XLA:CPU's
    convolution library, the kernels the layers receive, the decision behind them (None: the
    backend had started) and how glibc keeps a step's freed memory (None: it does not)."""

    host_devices: int | None
    convolutions: str
    kernels: kernels.KernelChoice
    decision: choice.Decision | None
    freed_memory: str | None


def set_up(
    section: Mapping[str, Any],
    *,
    batch_sizes: Sequence[int],
    present_devices: bool,
    recorded: Mapping[str, Any] | None,
    recorded_in: str,
) -> CpuSetup:
    """Set this process up for XLA:CPU from ``config.runtime`` (``section``). ``batch_sizes``: the
    per-process batches the device count must divide; ``present_devices=False`` leaves the count
    as it is. ``recorded``: a resumed run's decision (``run.json``'s ``kernels``, read from
    ``recorded_in``). Raises ValueError for a setting this machine cannot honour, naming the key."""
    presented = None
    if present_devices:
        count = devices.host_device_count(section["host_devices"], batch_sizes)
        presented = devices.present_host_devices(count)
    decision, freed_memory = None, None
    if not devices.backend_started():  # after it, XLA read its flags already: nothing can change
        if memory.kept_heap_in_effect():
            freed_memory = "the process started with glibc's malloc tunables"
        # Before XLA's threads exist: each takes its malloc arena when it first allocates.
        elif bool(section.get("reuse_freed_memory", True)) and memory.reuse_freed_memory():
            freed_memory = "config.runtime.reuse_freed_memory"
        decision = choice.choose(
            section["cpu_convolutions"],
            section.get("cpu_weight_gradient", "auto"),
            recorded=recorded,
            recorded_in=recorded_in,
            log=lambda line: print(f"dew: {line}", flush=True),
        )
    library = flags.route_convolutions(section["cpu_convolutions"] if decision is None else decision.library)
    global _applied
    _applied = decision
    chosen = flags.weight_gradient_choice() if decision is None else decision.kernel_choice()
    return CpuSetup(presented, library, chosen, decision, freed_memory)


_applied: choice.Decision | None = None


def applied_record() -> dict | None:
    """The record of the decision this process runs with (``set_up`` made it), for its
    ``run.json`` (None where none was made), with the CPU and jaxlib it was made for."""
    if _applied is None:
        return None
    record = _applied.record()
    return {**record, "how": _applied.how, "cpu": choice.cpu_model(), "jaxlib": choice.jaxlib_version()}


__all__ = ["CpuSetup", "applied_record", "set_up"]
