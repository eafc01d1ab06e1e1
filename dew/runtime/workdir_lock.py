"""One run per workdir: an advisory lock on ``<workdir>/run.lock`` naming its holder.

The lock is ``fcntl.flock`` on the file, so the kernel releases it when the holding process
dies, however it dies (``kill -9`` included); the file's JSON names the holder (pid, host, since
when) for the error a second run gets. A lock file left with a holder in it but no process
holding the flock is stale (its run was killed): the next run takes it over and says so.
Needs a file system that enforces flock (local disks, NFSv4); a workdir on one that does not is
not protected.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
from typing import Any

LOCK_FILE = "run.lock"


class WorkdirBusyError(RuntimeError):
    """Another live run holds the workdir; the message names it (pid, host, since when)."""


class WorkdirUnusableError(RuntimeError):
    """The workdir (or its lock file) cannot be created or written: a read-only file system, a
    directory such as ``/proc`` that takes no files, no permission, a full disk. The message
    names the path, the reason and what to do."""


#: What to do, by errno, when the lock file cannot be written.
_ADVICE = {
    errno.ENOSPC: "free space on that file system, or choose a --workdir on another one",
    errno.EDQUOT: "free space within your quota, or choose a --workdir on another file system",
    errno.EROFS: "it is on a read-only file system: choose a writable --workdir",
}


def _unusable(workdir: str, path: str, error: OSError, what: str = "used") -> WorkdirUnusableError:
    reason = error.strerror or type(error).__name__
    default = "choose a directory you can write to as --workdir"
    advice = default if error.errno is None else _ADVICE.get(error.errno, default)
    return WorkdirUnusableError(f"--workdir={workdir} cannot be {what}: {path}: {reason}; {advice}")


class WorkdirLock:
    """``with WorkdirLock(workdir):`` holds the workdir for this process, or raises
    ``WorkdirBusyError``. ``stale`` is the holder a stale lock named when it was taken over."""

    def __init__(self, workdir: str):
        self.workdir = os.path.abspath(workdir)
        self.path = os.path.join(self.workdir, LOCK_FILE)
        self.stale: dict[str, Any] | None = None
        self._fd: int | None = None

    def acquire(self) -> WorkdirLock:
        """Take the lock (creating the workdir); ``WorkdirBusyError`` when another live run holds
        it, ``WorkdirUnusableError`` when the directory or the lock file cannot be written."""
        try:
            os.makedirs(self.workdir, exist_ok=True)
        except OSError as e:
            raise _unusable(self.workdir, e.filename or self.workdir, e, "created") from None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise _unusable(self.workdir, self.path, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise _unusable(self.workdir, self.path, e) from None
            raise WorkdirBusyError(self._busy_message(_read_holder(self.path))) from None
        self.stale = _read_holder(self.path)  # a holder left behind by a run that was killed
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
            os.fsync(fd)
        except OSError as e:  # a full disk: the holder cannot be named
            os.close(fd)  # drops the flock
            raise _unusable(self.workdir, self.path, e) from None
        self._fd = fd
        return self

    def release(self) -> None:
        """Empty the file (a clean exit leaves no holder behind) and drop the lock."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _busy_message(self, holder: dict[str, Any] | None) -> str:
        who = (
            f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')}"
            if holder
            else "another process (its lock file names no holder yet)"
        )
        return (
            f"--workdir={self.workdir} is in use by a running dew run: {who} (lock {self.path}). "
            "Wait for it to finish, stop it, or choose another --workdir"
        )


def describe_stale(holder: dict[str, Any]) -> str:
    """The line a run prints when it takes over a stale lock."""
    return (
        f"taking over a stale lock: the run that held it (pid {holder.get('pid')} on host "
        f"{holder.get('host')} since {holder.get('since')}) is gone"
    )


def _read_holder(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        holder = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
