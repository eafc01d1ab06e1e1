"""The fresh state built on the host's CPU, then placed on the run's shardings.

A network's initialisers are one threefry draw per parameter, and XLA's TPU compiler takes about
a third of a second a draw: on a TPU v5e the init of SiT-B/2 (131 parameters) compiled in 41-45 s,
the longest wait of a cold start, and 131 bare ``jax.random.normal`` draws of its shapes alone in
41 s (``benchmarks/RESULTS.md``). The host's CPU compiles the same program in a few seconds. So
where the devices are accelerators and nothing else is compiling, ``HostInit`` runs the init
program on the host's CPU (the CPU's compile, cached like any other) and puts each leaf of the
result on the state's sharding:
on one process ``jax.device_put``; on several, every process builds the whole state from the same
seed and places the shards its devices hold.

The values are the CPU's: the same threefry bits, turned into floats by the CPU's arithmetic, so a
state built this way equals a CPU run's fresh state and may differ from one built on the
accelerator in the last bit of a float. ``config.runtime.fresh_state`` chooses (``builds_on_host``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dew.training import typed_jax

#: ``config.runtime.fresh_state``'s values.
FRESH_STATE_CHOICES = ("auto", "host", "devices")


def host_cpu() -> jax.Device | None:
    """The host's first CPU device, or None where JAX runs without its CPU backend
    (``JAX_PLATFORMS`` naming only an accelerator)."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


def builds_on_host(setting: str, *, beside_compile: bool = False) -> bool:
    """Whether the fresh state is built on the host's CPU: ``'host'`` always (where the host has
    a CPU backend), ``'devices'`` never, ``'auto'`` where the devices are not CPUs, the run is one
    process (several build on their devices, each only its shards) and the step is not compiling
    in a thread meanwhile (``beside_compile``, as ``Trainer.train`` starts): there the devices'
    compile of the init overlaps the step's, and on a TPU v5e SiT-B/2's first step came cold in
    63 s that way against 71 s with the host's build (``benchmarks/RESULTS.md``)."""
    if setting not in FRESH_STATE_CHOICES:
        raise ValueError(f"config.runtime.fresh_state={setting!r} is not one of {FRESH_STATE_CHOICES}")
    if setting == "devices" or host_cpu() is None:
        return False
    if setting == "host":
        return True
    return not beside_compile and jax.default_backend() != "cpu" and jax.process_count() == 1


def _place(leaf: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """One leaf of the host's state on ``sharding``: directly where this process holds every
    device of it, else only the shards its devices hold."""
    if sharding.is_fully_addressable:
        return typed_jax.device_put(leaf, sharding)
    host = np.asarray(leaf)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


class HostInit:
    """``init(rng, batch) -> state`` run on the host's CPU and placed on ``shardings`` (the
    state's, as ``Layout.state_shardings`` gives them). ``compiler_options``: the CPU compile's
    (``Layout.jit_init``'s)."""

    def __init__(
        self, init: Callable[..., Any], shardings: Any, compiler_options: dict[str, Any] | None = None
    ):
        self.shardings = shardings
        self._init = typed_jax.jit(init, compiler_options=compiler_options)

    def __call__(self, rng: jax.Array, batch: Any) -> Any:
        cpu = host_cpu()
        if cpu is None:
            raise RuntimeError("the fresh state is built on the host's CPU; JAX runs without its CPU backend")
        state = self._init(typed_jax.device_put(rng, cpu), typed_jax.device_put(batch, cpu))
        return jax.tree.map(_place, state, self.shardings)


__all__ = ["FRESH_STATE_CHOICES", "HostInit", "builds_on_host", "host_cpu"]
