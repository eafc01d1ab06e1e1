"""Several processes, one run: JAX's multi-controller runtime, started by ``dew.runtime.start``.

A run spans several processes (one per host, or one per accelerator) when it is told so, in this
order of precedence:

1. flags of ``python -m dew.main``: ``--coordinator=HOST:PORT --num_processes=N --process_id=I``;
2. the environment: ``DEW_COORDINATOR``, ``DEW_NUM_PROCESSES``, ``DEW_PROCESS_ID``;
3. a cluster JAX detects itself (``jax._src.clusters``: SLURM, Open MPI, Cloud TPU pods,
   Kubernetes), when it reports more than one process (``dew.runtime.cluster_detection``: a
   cluster that cannot answer, such as a TPU VM without its metadata server, is one line and the
   run goes on as one process).

Given explicitly, all three values are needed. Nothing of the sort found: one process, and
nothing is started. ``start_processes`` then calls ``jax.distributed.initialize`` before JAX
starts its backend, with ``config.runtime.coordinator_timeout`` (how long a process waits for
the coordinator, process 0, to answer) and ``config.runtime.heartbeat_timeout`` (after how long
without a heartbeat a process counts as dead and the others stop instead of waiting for it in a
collective; on CPU a gloo collective with a killed peer usually fails first, "Connection reset
by peer"). On CPU, cross-process collectives run over gloo (``jax_cpu_collectives_implementation``).

JAX's client aborts the process (SIGABRT, a C++ stack, no Python exception) when the group does
not form within its initialisation timeout or a peer misses its heartbeats, and a Python callback
cannot replace that abort in jaxlib 0.10.2 (``missed_heartbeat_callback`` fails to convert the
status it is given and the process terminates). So dew watches first and JAX's own limits are set
beyond dew's (``JAX_GRACE``):

- a process other than 0 first knocks on the coordinator's port for up to the timeout: an
  unreachable coordinator is ``ProcessGroupError`` (bad input, exit 2) naming the address;
  process 0 hosts the coordinator: its port must be free to bind;
- while JAX connects (every process waits there for all the others to register), a deadline of
  ``coordinator_timeout`` stops the process with one line and exit 2 (``GroupNotFormed``):
  e.g. process 0 started alone;
- once connected, the processes agree on their config and watch each other's heartbeats
  (``dew.runtime.heartbeats``: ``agree``, ``PeerWatch``, ``leave``).

What stays JAX's: when process 0 dies outright (SIGKILL, a crash), the others' clients see the
coordination service vanish and abort at once from a C++ thread (their error polling fails),
before any Python code can run; and a process stopped for longer than ``heartbeat_timeout`` +
``JAX_GRACE`` is aborted by JAX when it resumes. ``python -m dew.main`` starts the watch; a
script that calls ``dew.runtime.start`` itself gets the deadline while connecting, not the
agreement check or the watch (``dew.runtime.heartbeats.agree`` is public for it).

Devices: under a cluster that puts several tasks on a node, JAX gives each task the device of
its local rank (one process per GPU); with one task per node (``srun --ntasks-per-node=1``, or
explicit flags) every process drives all of its host's devices, the usual JAX pattern on GPU
hosts. ``mesh_devices`` picks a mesh's devices as an equal number from every process.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dew.schema import ConfigError

ENVIRONMENT = ("DEW_COORDINATOR", "DEW_NUM_PROCESSES", "DEW_PROCESS_ID")
_FLAGS = ("--coordinator", "--num_processes", "--process_id")


class ProcessGroupError(ConfigError):
    """A process group that cannot be formed as asked: a missing or malformed value, or a
    coordinator that cannot be reached in time. Bad input: ``python -m dew.main`` exits 2."""


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """The processes of one run: the coordinator's ``HOST:PORT`` (process 0 hosts it), how many
    processes there are and which one this is, and where that was read (``origin``: 'flags',
    'environment' or a cluster's name). ``all_local_devices`` says whether this process drives
    every device of its host (False: JAX gives it the device of its local rank)."""

    coordinator: str
    num_processes: int
    process_id: int
    origin: str
    all_local_devices: bool = True

    @property
    def host(self) -> str:
        return self.coordinator.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.coordinator.rsplit(":", 1)[1])


def _explicit(values: Sequence[Any], names: Sequence[str], origin: str) -> ProcessGroup | None:
    """The group three explicit values describe (None when none is given); a partial or
    malformed set is a ``ProcessGroupError`` naming the value."""
    given = [v is not None and v != "" for v in values]
    if not any(given):
        return None
    if not all(given):
        missing = ", ".join(n for n, g in zip(names, given, strict=True) if not g)
        raise ProcessGroupError(
            f"{origin}: {missing} missing: a multi-process run needs all of {', '.join(names)}"
        )
    coordinator, count, index = (str(v).strip() for v in values)
    if not re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]+):\d{1,5}", coordinator) or not (
        0 < int(coordinator.rsplit(":", 1)[1]) < 65536
    ):
        raise ProcessGroupError(
            f"{names[0]}={coordinator!r} is invalid: expected HOST:PORT with a port in 1..65535"
        )
    try:
        count_int = int(count)
    except ValueError:
        count_int = 0
    if count_int < 1:
        raise ProcessGroupError(f"{names[1]}={count!r} is invalid: expected an int >= 1")
    try:
        index_int = int(index)
    except ValueError:
        index_int = -1
    if not 0 <= index_int < count_int:
        raise ProcessGroupError(
            f"{names[2]}={index!r} is invalid: expected an int in 0..{count_int - 1} ({names[1]}={count_int})"
        )
    return ProcessGroup(coordinator, count_int, index_int, origin)


def _detected(initialization_timeout: int) -> ProcessGroup | None:
    """The group of a cluster JAX detects (``cluster_detection.detect``), or None (none detected,
    one process, or a cluster that could not answer: then one line says so and the run goes on
    as one process)."""
    from dew.runtime import cluster_detection

    detection = cluster_detection.detect(initialization_timeout)
    if detection.note is not None:
        print(f"dew: {detection.note}", flush=True)
    found = detection.group
    if found is None:
        return None
    tasks = found.tasks_on_node
    return ProcessGroup(
        found.coordinator,
        found.num_processes,
        found.process_id,
        found.cluster,
        all_local_devices=tasks is None or tasks == 1,
    )


def requested(
    coordinator: str | None = None,
    num_processes: int | str | None = None,
    process_id: int | str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    detect: bool = True,
    initialization_timeout: int = 300,
) -> ProcessGroup | None:
    """The process group this process belongs to (see the module docstring for the order), or
    None for a single-process run. Raises ``ProcessGroupError`` for a partial or malformed one."""
    group = _explicit((coordinator, num_processes, process_id), _FLAGS, "flags")
    if group is not None:
        return group
    environ = os.environ if environ is None else environ
    group = _explicit([environ.get(k) for k in ENVIRONMENT], ENVIRONMENT, "environment")
    if group is not None:
        return group
    return _detected(initialization_timeout) if detect else None


def check_devices(mesh_devices: int, num_processes: int) -> None:
    """A mesh of ``mesh_devices`` (0: all) over ``num_processes`` processes takes the same number
    of devices from each: a count they do not divide is a ``ConfigError`` naming the field."""
    if mesh_devices and mesh_devices % num_processes:
        raise ConfigError(
            f"config.mesh.devices={mesh_devices} is invalid with {num_processes} processes: expected "
            f"a multiple of {num_processes} (each process gives the mesh an equal number of its "
            "devices), or 0 for every device"
        )


def mesh_devices(count: int | None = None) -> list[Any]:
    """``count`` devices for a mesh (None or 0: all of ``jax.devices()``), the same number from
    every process, each process's own in order; raises ``ConfigError`` when the process count
    does not divide ``count`` (``check_devices``) or a process has too few."""
    import jax

    devices = jax.devices()
    processes = jax.process_count()
    if not count or processes == 1:  # one process: MeshSpec takes the first ``count`` itself
        return devices
    check_devices(count, processes)
    per_process = count // processes
    chosen = []
    for index in range(processes):
        own = [d for d in devices if d.process_index == index]
        if len(own) < per_process:
            raise ConfigError(
                f"config.mesh.devices={count} is invalid: it takes {per_process} devices from each of "
                f"{processes} processes, and process {index} has {len(own)}"
            )
        chosen += own[:per_process]
    return chosen


def _await_coordinator(group: ProcessGroup, timeout: float) -> None:
    """Knock on the coordinator's port until it answers or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while True:
        try:
            with socket.create_connection((group.host, group.port), timeout=max(0.1, min(2.0, timeout))):
                return
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    raise ProcessGroupError(
        f"the coordinator {group.coordinator} (from {group.origin}) cannot be reached within "
        f"{timeout:g} s (config.runtime.coordinator_timeout): {last}; start process 0 of "
        f"{group.num_processes} there, or give the address it listens on"
    )


def _check_bindable(group: ProcessGroup) -> None:
    """Process 0 hosts the coordinator on ``group.port``: a port another program holds is named."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in group.host else socket.AF_INET) as s:
            s.bind(("", group.port))
    except OSError as e:
        raise ProcessGroupError(
            f"the coordinator {group.coordinator} (from {group.origin}) cannot be hosted by process 0: "
            f"port {group.port} is not free ({e.strerror or e})"
        ) from None


#: Seconds JAX's own limits (initialisation, heartbeat) are set beyond dew's, so dew's checks, which
#: stop with one line, come first and JAX's abort is only the last resort.
JAX_GRACE = 30


class GroupNotFormed(ProcessGroupError):
    """JAX's distributed client did not connect within ``config.runtime.coordinator_timeout``:
    some process of the group never joined (bad input: exit 2)."""


def _print_and_exit(error: BaseException, code: int) -> None:
    """Stop the process now with one line (what a thread of this module does when no ``stop``
    was given): nothing of JAX's teardown runs, since the group cannot shut down in step."""
    import sys

    print(f"error: {' '.join(str(error).split())}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


class _Deadline:
    """``with _Deadline(seconds, error):`` calls ``_print_and_exit(error(), 2)`` from a thread
    when the block has not ended within ``seconds`` (for a C++ call that holds no GIL and
    aborts the process when its own, later, deadline passes)."""

    def __init__(self, seconds: float, error):
        self.seconds, self.error = seconds, error
        self.done = threading.Event()

    def _watch(self) -> None:
        if not self.done.wait(self.seconds):
            _print_and_exit(self.error(), 2)

    def __enter__(self) -> _Deadline:
        threading.Thread(target=self._watch, name="dew-group-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()


def start_processes(group: ProcessGroup, coordinator_timeout: int, heartbeat_timeout: int) -> bool:
    """Join this process to ``group`` through ``jax.distributed.initialize`` (before JAX starts
    its backend); return False when the runtime was already started (by the user's script).
    Raises ``ProcessGroupError`` for an unreachable coordinator or a port process 0 cannot bind;
    a group that does not form within ``coordinator_timeout`` seconds (a process never started)
    stops this process with one line, exit 2 (``GroupNotFormed``). JAX's own deadlines are
    ``JAX_GRACE`` seconds later (see the module docstring)."""
    import jax

    if jax.distributed.is_initialized():
        return False
    if group.process_id == 0:
        _check_bindable(group)
    else:
        _await_coordinator(group, coordinator_timeout)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes

    def not_formed() -> GroupNotFormed:
        return GroupNotFormed(
            f"the process group did not form within {coordinator_timeout:g} s "
            f"(config.runtime.coordinator_timeout): process {group.process_id} of {group.num_processes} "
            f"reached the coordinator {group.coordinator} (from {group.origin}) and waited for the "
            f"others to join; start all {group.num_processes} processes with the same coordinator and "
            "process count"
        )

    with _Deadline(coordinator_timeout, not_formed):
        jax.distributed.initialize(
            coordinator_address=group.coordinator,
            num_processes=group.num_processes,
            process_id=group.process_id,
            local_device_ids=None,
            cluster_detection_method="deactivate" if group.all_local_devices else None,
            initialization_timeout=int(coordinator_timeout) + JAX_GRACE,
            heartbeat_timeout_seconds=int(heartbeat_timeout) + JAX_GRACE,
        )
    return True


__all__ = [
    "ENVIRONMENT",
    "JAX_GRACE",
    "GroupNotFormed",
    "ProcessGroup",
    "ProcessGroupError",
    "check_devices",
    "mesh_devices",
    "requested",
    "start_processes",
]
