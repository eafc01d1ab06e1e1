"""One run per workdir, with real processes: a second holder is refused naming the first; a
lock whose holder was killed (kill -9) is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from dew.runtime.workdir_lock import WorkdirBusyError, WorkdirLock

HOLD = """
import sys, time
from dew.runtime.workdir_lock import WorkdirLock
lock = WorkdirLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def hold(workdir) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(workdir)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_second_holder_is_refused_naming_the_first_then_a_killed_holders_lock_is_taken_over(tmp_path):
    first = hold(tmp_path)
    try:
        with pytest.raises(WorkdirBusyError) as busy:
            WorkdirLock(str(tmp_path)).acquire()
        message = str(busy.value)
        assert (
            f"in use by a running dew run: pid {first.pid} on host {socket.gethostname()} since 20" in message
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    with WorkdirLock(str(tmp_path)) as lock:  # the kernel dropped the dead holder's flock
        assert lock.stale is not None and lock.stale["pid"] == first.pid
        assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    assert (tmp_path / "run.lock").read_text() == ""  # a clean release names no holder
    with WorkdirLock(str(tmp_path)) as lock:
        assert lock.stale is None


def test_the_lock_is_held_until_released_within_one_process_too(tmp_path):
    lock = WorkdirLock(str(tmp_path)).acquire()
    started = time.time()
    with pytest.raises(WorkdirBusyError, match=f"pid {os.getpid()}"):
        WorkdirLock(str(tmp_path)).acquire()  # flock is per open file: a second open conflicts
    assert time.time() - started < 1.0  # refused at once, not after a wait
    lock.release()
    WorkdirLock(str(tmp_path)).acquire().release()
