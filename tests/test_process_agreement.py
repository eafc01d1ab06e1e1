"""The checks that keep the processes of one run in step, on their own (the processes themselves
are in tests/system/test_cli_multiprocess.py): the resolved configs compared key by key, and the peer
watch judging heartbeats published in a key-value store (here a dict behind the coordinator
client's four calls), on real threads and clocks."""

from __future__ import annotations

import threading
import time

import pytest
from ml_collections import ConfigDict

from dew.runtime import heartbeats


def test_config_entries_are_every_key_but_the_process_local_ones():
    config = ConfigDict(
        {"optimizer": {"learning_rate": 1e-3, "b1": 0.9}, "runtime": {"compilation_cache": "/x"}}
    )
    assert dict(heartbeats.config_entries(config)) == {"optimizer.learning_rate": 1e-3, "optimizer.b1": 0.9}


def test_the_first_differing_key_is_named_alike_in_every_process():
    base = [("dataset.batch_size", 16), ("optimizer.learning_rate", 0.002), ("train.num_steps", 60)]
    assert heartbeats.disagreement({0: base, 1: list(base), 2: list(base)}) is None
    other = [("dataset.batch_size", 16), ("optimizer.learning_rate", 0.003), ("train.num_steps", 61)]
    line = heartbeats.disagreement({0: base, 1: list(base), 2: other})
    assert line == (
        "the processes of this run resolved different configs: config.optimizer.learning_rate is 0.002 in "
        "process 0 and 0.003 in process 2 of 3; start every process with the same config and overrides"
    )
    extra = [*base, ("model.dropout", 0.1)]
    line = heartbeats.disagreement({0: base, 1: extra})
    assert line is not None
    assert "config.model.dropout is no such key in process 0 and 0.1 in process 1" in line


class Store:
    """The coordination client's key-value calls the peer watch makes, on a dict."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.lock = threading.Lock()
        self.answering = True

    def _wait(self) -> None:
        while not self.answering:  # a stopped coordinator: the call never returns
            time.sleep(0.05)

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        self._wait()
        with self.lock:
            self.values[key] = value

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        self._wait()
        with self.lock:
            return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]

    def key_value_try_get(self, key: str) -> str:
        self._wait()
        with self.lock:
            return self.values[key]


class Peer:
    """Another process's heartbeat, published every 0.1 s until ``stopped``."""

    def __init__(self, store: Store, index: int) -> None:
        self.store, self.index, self.stopped = store, index, threading.Event()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        tick = 0
        while not self.stopped.wait(0.1):
            tick += 1
            self.store.key_value_set(f"dew/alive/{self.index}", str(tick), True)


def watch(
    store: Store, index: int, timeout: float = 2.0
) -> tuple[heartbeats.PeerWatch, list, threading.Event]:
    lost: list[BaseException] = []
    called = threading.Event()

    def stop(error: BaseException) -> None:
        lost.append(error)
        called.set()

    return heartbeats.PeerWatch(store, index, 2, timeout, stop), lost, called


def test_a_peer_whose_heartbeat_stops_is_judged_lost_after_the_timeout_not_before():
    store = Store()
    peer = Peer(store, 1)
    watcher, lost, called = watch(store, 0)
    try:
        assert not called.wait(3.0)  # beating: never judged, well past the timeout
        peer.stopped.set()
        stopped_at = time.monotonic()
        assert called.wait(10.0)
        waited = time.monotonic() - stopped_at
        assert 2.0 <= waited < 2.0 + 3.0, waited  # the timeout, plus the poll intervals
        (error,) = lost
        assert isinstance(error, heartbeats.PeerLost)
        assert str(error).startswith("process 1 of 2 stopped answering: no heartbeat for 2 s")
        assert "Python stacks of this process's threads" in error.__notes__[0]
    finally:
        watcher.close("done")


def test_a_stopped_coordinator_is_judged_lost_when_its_store_stops_answering():
    store = Store()
    peer = Peer(store, 0)
    watcher, lost, called = watch(store, 1)
    try:
        assert not called.wait(1.0)
        store.answering = False  # process 0, which hosts the store, is stopped
        assert called.wait(10.0)
        assert str(lost[0]).startswith("process 0 of 2 (the coordinator) stopped answering: ")
    finally:
        peer.stopped.set()
        store.answering = True
        watcher.close("done")


@pytest.mark.parametrize("mark, judged", [("left:1", True), ("done", False)])
def test_a_peer_that_left_with_a_failure_stops_this_process_one_that_finished_does_not(mark, judged):
    store = Store()
    peer = Peer(store, 1)
    watcher, lost, called = watch(store, 0, timeout=2.0)
    try:
        time.sleep(0.5)
        peer.stopped.set()
        store.key_value_set("dew/alive/1", mark)
        assert called.wait(1.0 + 3.0) is judged  # grace: 1 s (half the timeout)
        if judged:
            assert str(lost[0]) == (
                "process 1 of 2 left the run with exit status 1 (see its output), so this process stops too"
            )
    finally:
        watcher.close("done")
    assert store.values["dew/alive/0"] == "done"  # what this process tells its peers as it finishes
