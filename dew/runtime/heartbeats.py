"""The run's processes in step once they have joined (``dew.runtime.distributed`` joins them):
the configs they agree on, the heartbeats they watch, leaving the group and its barriers.

``agree`` (every process, once JAX is connected): the processes exchange their resolved configs
through the coordinator's key-value store; any difference stops all of them with the same line
naming the first differing key (``ConfigDisagreement``, exit 2). Then each process publishes a
heartbeat of its own there (``PeerWatch``): process 0 watches every other process, the others
watch process 0, and a peer whose heartbeat stops for ``heartbeat_timeout`` seconds (dead,
stopped with SIGSTOP, hung), or that left the run with a failure, stops this process through
the caller's ``stop`` (``python -m dew.main``: one line, exit 1, a traceback file). A process
that leaves with a failure or bad input marks it (``leave``) and ends without JAX's shutdown
barrier, which its peers never reach; process 0 first waits for its peers to go.
``python -m dew.main`` starts the watch; a script that calls ``dew.runtime.start`` itself gets
the deadline while connecting, not the agreement check or the watch (``agree`` is public for it).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dew.runtime.distributed import ProcessGroupError, _print_and_exit

#: Keys of the resolved config each process may set for itself (they change no result).
PROCESS_LOCAL = ("runtime.compilation_cache",)


class ConfigDisagreement(ProcessGroupError):
    """The processes of one run resolved different configs (bad input: exit 2)."""


class PeerLost(RuntimeError):
    """A process of the run stopped answering or left it with a failure: this one stops too
    (a failure: exit 1)."""


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


def agree(
    config: Any,
    timeout: float,
    heartbeat_timeout: float,
    stop: Callable[[BaseException], object] | None = None,
) -> str:
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
    "PROCESS_LOCAL",
    "ConfigDisagreement",
    "PeerLost",
    "PeerWatch",
    "agree",
    "barrier",
    "config_entries",
    "disagreement",
    "leave",
    "stop_processes",
    "watching",
]
