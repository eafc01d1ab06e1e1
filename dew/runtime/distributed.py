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
- ``agree`` (every process, once JAX is connected): the processes exchange their resolved
  configs through the coordinator's key-value store; any difference stops all of them with the
  same line naming the first differing key (``ConfigDisagreement``, exit 2). Then each process
  publishes a heartbeat of its own there (``PeerWatch``): process 0 watches every other process,
  the others watch process 0, and a peer whose heartbeat stops for ``heartbeat_timeout`` seconds
  (dead, stopped with SIGSTOP, hung), or that left the run with a failure, stops this process
  through the caller's ``stop`` (``python -m dew.main``: one line, exit 1, a traceback file);
- a process that leaves with a failure or bad input marks it (``leave``) and ends without JAX's
  shutdown barrier, which its peers never reach; process 0 first waits for its peers to go.

What stays JAX's: when process 0 dies outright (SIGKILL, a crash), the others' clients see the
coordination service vanish and abort at once from a C++ thread (their error polling fails),
before any Python code can run; and a process stopped for longer than ``heartbeat_timeout`` +
``JAX_GRACE`` is aborted by JAX when it resumes. ``python -m dew.main`` starts the watch; a
script that calls ``dew.runtime.start`` itself gets the deadline while connecting, not the
agreement check or the watch (``agree`` is public for it).

Devices: under a cluster that puts several tasks on a node, JAX gives each task the device of
its local rank (one process per GPU); with one task per node (``srun --ntasks-per-node=1``, or
explicit flags) every process drives all of its host's devices, the usual JAX pattern on GPU
hosts. ``mesh_devices`` picks a mesh's devices as an equal number from every process.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
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
#: Keys of the resolved config each process may set for itself (they change no result).
PROCESS_LOCAL = ("runtime.compilation_cache",)


class GroupNotFormed(ProcessGroupError):
    """JAX's distributed client did not connect within ``config.runtime.coordinator_timeout``:
    some process of the group never joined (bad input: exit 2)."""


class ConfigDisagreement(ProcessGroupError):
    """The processes of one run resolved different configs (bad input: exit 2)."""


class PeerLost(RuntimeError):
    """A process of the run stopped answering or left it with a failure: this one stops too
    (a failure: exit 1)."""


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


def _client() -> Any:
    """JAX's distributed client (only called with a process group, where it exists)."""
    from jax._src import distributed

    client = distributed.global_state.client
    assert client is not None, "the distributed client exists once jax.distributed is initialised"
    return client


def config_entries(config: Any) -> list[tuple[str, Any]]:
    """The resolved config as ``(dotted key, JSON value)`` pairs in the config's own order,
    without ``PROCESS_LOCAL`` keys: what the processes of a run must agree on."""
    as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    plain = json.loads(json.dumps(as_dict, default=repr))
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif prefix not in PROCESS_LOCAL:
            out.append((prefix, value))

    walk("", plain)
    return out


def disagreement(configs: Mapping[int, Sequence[tuple[str, Any]]]) -> str | None:
    """The first difference between the processes' ``config_entries`` (by process index), as a
    line for a person, or None when they all agree. Every process computes the same line."""
    reference = dict(configs[0])
    for index in sorted(configs):
        other = dict(configs[index])
        if other == reference:
            continue
        keys = [k for k, _ in configs[0]] + [k for k, _ in configs[index] if k not in reference]
        key = next(k for k in keys if reference.get(k, _MISSING) != other.get(k, _MISSING))

        def shown(value: Any) -> str:
            return "no such key" if value is _MISSING else json.dumps(value)

        return (
            f"the processes of this run resolved different configs: config.{key} is "
            f"{shown(reference.get(key, _MISSING))} in process 0 and {shown(other.get(key, _MISSING))} "
            f"in process {index} of {len(configs)}; start every process with the same config and overrides"
        )
    return None


_MISSING = object()


def agree(config: Any, timeout: float, heartbeat_timeout: float, stop=None) -> str:
    """In a multi-process run (a no-op returning '' otherwise), check that every process resolved
    the same ``config`` (``config_entries``), exchanged through the coordinator's key-value
    store; return the digest all agreed on. A difference shuts the group down in step and
    raises ``ConfigDisagreement`` in every process, with the same line naming the first
    differing key. Then start watching the peers (``PeerWatch``; ``stop(error)`` is called
    from its thread when one is lost, default: one line, exit 1). ``timeout``: seconds to wait
    for every process to publish its config (``config.runtime.coordinator_timeout``)."""
    import jax

    if jax.process_count() == 1:
        return ""
    client, index, count = _client(), jax.process_index(), jax.process_count()
    entries = config_entries(config)
    text = json.dumps(entries, separators=(",", ":"))
    client.key_value_set(f"dew/config/{index}", text, allow_overwrite=True)
    client.wait_at_barrier("dew/config-published", int(timeout * 1000))
    configs = {
        int(key.rsplit("/", 1)[1]): [tuple(e) for e in json.loads(value)]
        for key, value in client.key_value_dir_get("dew/config/")
    }
    if sorted(configs) != list(range(count)):
        raise ProcessGroupError(
            f"the coordinator holds the configs of processes {sorted(configs)}, not of all {count}"
        )
    problem = disagreement(configs)
    if problem is not None:
        stop_processes()  # every process found the same difference: leave in step, then stop
        raise ConfigDisagreement(problem)
    global _WATCH
    _WATCH = PeerWatch(client, index, count, heartbeat_timeout, stop or (lambda e: _print_and_exit(e, 1)))
    return hashlib.sha256(text.encode()).hexdigest()


class PeerWatch:
    """Heartbeats of dew's own through the coordinator's key-value store (``dew/alive/<index>``),
    so that a lost peer stops this process with a line of dew's before JAX's client aborts it.

    A thread publishes this process's count every ``interval`` seconds and reads the watched
    peers' (process 0 reads every process, the others process 0), noting when each last
    changed; a second thread judges, and calls ``stop(PeerLost(...))`` when a watched peer's
    count has not changed for ``heartbeat_timeout`` seconds, when the store itself has not
    answered for as long (process 0, which hosts it, is stopped or gone), or ``grace`` seconds
    after a peer marked that it left the run with a failure (``leave``), time for this process
    to reach its own exit if it failed alike. A peer that marked ``done`` is no longer judged."""

    def __init__(self, client, index: int, count: int, heartbeat_timeout: float, stop) -> None:
        self.client, self.index, self.count, self.stop = client, index, count, stop
        self.timeout = float(heartbeat_timeout)
        self.interval = max(0.25, min(2.0, self.timeout / 20))
        self.grace = min(5.0, self.timeout / 2)
        self.watched = [i for i in range(count) if i != index] if index == 0 else [0]
        now = time.monotonic()
        self.answered = now
        self.seen: dict[int, tuple[str | None, float]] = {i: (None, now) for i in self.watched}
        self.ended = threading.Event()
        self.tick = 0
        self.lock = threading.Lock()
        for target, name in ((self._publish, "dew-heartbeat"), (self._judge, "dew-peer-watch")):
            threading.Thread(target=target, name=name, daemon=True).start()
        atexit.register(self.leave, "left")  # an exit that is neither done nor ``leave``: say so

    def _read(self) -> dict[int, str]:
        if self.index == 0:
            return {int(k.rsplit("/", 1)[1]): v for k, v in self.client.key_value_dir_get("dew/alive/")}
        return {0: self.client.key_value_try_get("dew/alive/0")}

    def _publish(self) -> None:
        while not self.ended.is_set():
            try:
                with self.lock:
                    if self.ended.is_set():
                        return
                    self.tick += 1
                    self.client.key_value_set(f"dew/alive/{self.index}", str(self.tick), allow_overwrite=True)
                    values = self._read()
                now = time.monotonic()
                self.answered = now
                for peer in self.watched:
                    value = values.get(peer)
                    if value is not None and value != self.seen[peer][0]:
                        self.seen[peer] = (value, now)
            except Exception:  # the store did not answer: judged by how long ago it last did
                pass
            self.ended.wait(self.interval)

    def lost(self, now: float) -> PeerLost | None:
        """The peer judged lost at ``now`` (monotonic seconds), or None."""

        def who(peer: int) -> str:
            return f"process {peer} of {self.count}" + (" (the coordinator)" if peer == 0 else "")

        def stopped_answering(peer: int, what: str, since: float) -> PeerLost:
            return PeerLost(
                f"{who(peer)} stopped answering: {what} for {now - since:.0f} s "
                f"(config.runtime.heartbeat_timeout={self.timeout:g}); it died, was stopped or hangs, "
                "so this process stops too"
            )

        if now - self.answered > self.timeout:  # the store process 0 hosts
            return stopped_answering(0, "its key-value store did not answer", self.answered)
        for peer, (value, since) in self.seen.items():
            if value == "done":
                continue
            if value is not None and value.startswith("left"):
                if now - since > self.grace:
                    status = value.partition(":")[2]
                    return PeerLost(
                        f"{who(peer)} left the run"
                        + (f" with exit status {status}" if status else "")
                        + " (see its output), so this process stops too"
                    )
                continue
            if now - since > self.timeout:
                return stopped_answering(peer, "no heartbeat", since)
        return None

    def _judge(self) -> None:
        while not self.ended.wait(self.interval / 2):
            error = self.lost(time.monotonic())
            if error is not None and not self.ended.is_set():
                error.add_note(_thread_stacks())
                self.stop(error)
                return

    def close(self, mark: str, wait: float = 2.0) -> None:
        """Stop watching and publish ``mark`` ('done', or 'left:<status>') for the peers,
        waiting at most ``wait`` seconds for the store (it may be gone)."""
        if self.ended.is_set():
            return

        def publish() -> None:
            with self.lock:
                self.ended.set()
                with contextlib.suppress(Exception):
                    self.client.key_value_set(f"dew/alive/{self.index}", mark, allow_overwrite=True)

        thread = threading.Thread(target=publish, name="dew-heartbeat-close", daemon=True)
        thread.start()
        thread.join(wait)
        self.ended.set()

    def wait_for_peers(self, limit: float) -> None:
        """Process 0, leaving: wait (at most ``limit`` seconds) until every peer whose heartbeat
        was alive has marked that it left or finished. The coordination service lives in this
        process, and a peer still connected when it goes is aborted by JAX's client at once
        (its error polling fails: no Python callback can intercept that), so the peers, told by
        the mark, leave first."""
        if self.index != 0:
            return
        now = time.monotonic()
        deadline = now + limit
        # peer -> (its last value, when it changed): a peer that stops beating is not waited for
        beating = {p: (v, now) for p, (v, since) in self.seen.items() if now - since <= self.timeout}
        while beating and time.monotonic() < deadline:
            try:
                values = dict(self._read())
            except Exception:
                return
            now = time.monotonic()
            for peer, (value, since) in list(beating.items()):
                new = values.get(peer)
                silent = new == value and now - since > 3 * self.interval + 1
                if silent or str(new).startswith(("done", "left")):
                    del beating[peer]
                elif new != value:
                    beating[peer] = (new, now)
            if beating:
                time.sleep(self.interval / 2)

    def leave(self, mark: str) -> None:
        """``close(mark)`` and, in process 0, ``wait_for_peers`` (their grace and a few polls)."""
        if self.ended.is_set():
            return
        self.close(mark)
        self.wait_for_peers(self.grace + 4 * self.interval + 5.0)


_WATCH: PeerWatch | None = None


def _thread_stacks() -> str:
    """Every thread's Python stack, for the traceback file of a lost peer (where this process was)."""
    import sys
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    parts = ["Python stacks of this process's threads when the peer was judged lost:"]
    for ident, frame in sys._current_frames().items():
        parts.append(f"--- thread {names.get(ident, ident)}")
        parts.append("".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(parts)


def leave(status: int) -> None:
    """Tell the peers this process leaves the run with ``status`` (its heartbeat stops), before it
    exits without JAX's shutdown (``dew.failures.end_process``); process 0 waits for the peers
    to leave first (``PeerWatch.wait_for_peers``). A no-op outside a watched run."""
    if _WATCH is not None:
        _WATCH.leave(f"left:{status}")


def watching() -> bool:
    """Whether this process watches its peers (``agree`` started it, nothing ended it): a process
    that exits now should ``leave`` and end without JAX's shutdown barrier, which peers that
    leave too never reach (its failure aborts the process)."""
    return _WATCH is not None and not _WATCH.ended.is_set()


def barrier(name: str, timeout: float) -> None:
    """Wait until every process of the run reaches the barrier ``name`` (a no-op with one
    process); used after compiling, since gloo gives up on a peer that is slower than 30 s to
    reach the first collective."""
    import jax

    if jax.process_count() == 1:
        return
    _client().wait_at_barrier(name, int(timeout * 1000))


def stop_processes() -> None:
    """Leave the process group in step with the others (JAX's shutdown barrier), if one was
    joined; a process about to exit calls it so no peer sees it vanish mid-collective. The
    peers stop judging this process first (its heartbeat is marked done)."""
    import jax

    if _WATCH is not None:
        _WATCH.close("done")
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


__all__ = [
    "ENVIRONMENT",
    "JAX_GRACE",
    "PROCESS_LOCAL",
    "ConfigDisagreement",
    "GroupNotFormed",
    "PeerLost",
    "PeerWatch",
    "ProcessGroup",
    "ProcessGroupError",
    "agree",
    "barrier",
    "check_devices",
    "config_entries",
    "disagreement",
    "leave",
    "mesh_devices",
    "requested",
    "start_processes",
    "stop_processes",
    "watching",
]
