"""How ``python -m dew.main`` reports a failure: one short message, the full story in a file.

Bad input gets one line. A failure gets at most three on stderr: ``error: <what failed>``, the relevant cause
(the innermost exception the message does not already say), and where the full traceback was
written: ``<workdir>/logs/error-<UTC time>.log`` (or the system's temporary directory when the
workdir cannot take it, e.g. a full disk; a failure's ``__notes__``, such as the threads' stacks
when a peer process was lost, are part of it). Exit status: 2 for bad input (``ConfigError``,
``UnknownNameError``, and their subclasses such as a resume that does not fit the config; a
workdir that is busy or cannot be written; a damaged ``run.json``), which writes nothing; 1 for
any other failure.

A preempted run is no failure: ``run_failed`` says what was saved and the command that resumes
it, with the preemption's exit status. A lost peer of a process group ends this process through
``stop_process``: one report, then ``end_process``.

Library warnings from orbax and absl (through Python ``logging``) go to
``<workdir>/logs/dew.log`` once a run has started (``capture_library_logs``), not to the
console, so a failure is not buried in them.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import shlex
import sys
import tempfile
import threading
import traceback
from collections.abc import Sequence
from typing import TextIO

from dew.registry import UnknownNameError
from dew.schema import ConfigError

BAD_INPUT = (ConfigError, UnknownNameError)
#: Longest message printed for one exception; tensorstore errors carry kilobytes of spec.
_LIMIT = 600
_SPEC = re.compile(r"\s*\[tensorstore_spec=.*?\](?='|\)|$)|\s*\[source locations=.*?\]", re.S)


def exit_code(error: BaseException) -> int:
    """2 for bad input (and what a person can fix before anything is written: a workdir another
    live run holds or that cannot be written, a damaged ``run.json``), 1 for any other failure."""
    from dew.run_records import RunMetadataError
    from dew.runtime.workdir_lock import WorkdirBusyError, WorkdirUnusableError

    fixable = (*BAD_INPUT, WorkdirBusyError, WorkdirUnusableError, RunMetadataError)
    return 2 if isinstance(error, fixable) else 1


def short(error: BaseException) -> str:
    """An exception as one bounded line: its first line (all of a bad-input message, joined),
    tensorstore specs cut out."""
    text = _SPEC.sub("", str(error).strip())
    if isinstance(error, BAD_INPUT):  # written for a person: every line of it, joined
        text = " ".join(text.split())
    text = text.splitlines()[0] if text else type(error).__name__
    if isinstance(error, KeyError) and not isinstance(error, UnknownNameError):
        text = f"KeyError: {text}"
    return _bounded(text)


def _bounded(text: str) -> str:
    """``text`` cut to ``_LIMIT`` characters, keeping its last clause (after the last ": "):
    storage errors name long paths first and the reason a person needs (``No space left on
    device``) last."""
    if len(text) <= _LIMIT:
        return text
    reason = text.rsplit(": ", 1)[1][: _LIMIT // 3] if ": " in text else ""
    if not reason:
        return text[: _LIMIT - 1] + "…"
    return text[: _LIMIT - len(reason) - 3] + "…: " + reason


def root_cause(error: BaseException) -> BaseException | None:
    """The innermost exception ``error`` was raised from (explicit ``from``, or the one being
    handled when it was raised), or None."""
    seen, cause = {id(error)}, None
    current: BaseException | None = error
    while current is not None:
        nxt = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        cause = current = nxt
    return cause


def end_process(code: int) -> None:
    """Exit now with ``code``, after flushing the streams and the log handlers: a failure was
    reported, so no library thread's teardown (orbax's executors and event loops) may print
    after it. In a multi-process run the peers learn first that this process leaves
    (``dew.runtime.heartbeats.leave``), so they stop with a line of their own."""
    from dew.runtime.heartbeats import leave

    leave(code)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def write_traceback(error: BaseException, workdir: str | None) -> str | None:
    """Write the full traceback (with every chained exception) to a new file under
    ``<workdir>/logs`` or, failing that, the temporary directory; return its path (None when
    neither could be written)."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    text = "".join(traceback.format_exception(error))
    for directory in ([os.path.join(workdir, "logs")] if workdir else []) + [tempfile.gettempdir()]:
        try:
            os.makedirs(directory, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=f"error-{stamp}-", suffix=".log", dir=directory)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return path
        except OSError:
            continue
    return None


def report(error: BaseException, workdir: str | None, *, stream: TextIO | None = None) -> int:
    """Print ``error`` for a person (see the module docstring); return the exit status."""
    stream = stream or sys.stderr
    code = exit_code(error)
    lines = [f"error: {short(error)}"]
    cause = root_cause(error) if code == 1 else None  # bad input is one line, saying it all
    if cause is not None:
        text = short(cause)
        if text[:80] not in str(error):  # a cause the message already quotes is not repeated
            lines.append(f"  cause: {type(cause).__name__}: {text}")
    if code == 1:
        path = write_traceback(error, workdir)
        lines.append(f"  full traceback: {path}" if path else "  (the traceback could not be written)")
    print("\n".join(lines), file=stream, flush=True)
    return code


def stop_process(error: BaseException, workdir: str) -> None:
    """End this process for ``error`` at once: one report (the traceback under
    ``<workdir>/logs`` where that directory exists, else the temporary directory), then
    ``end_process`` with the report's exit status. What a lost peer of a process group does."""
    code = report(error, workdir if os.path.isdir(workdir) else None)
    end_process(code)


def run_failed(error: Exception, workdir: str, argv: Sequence[str]) -> int:
    """The exit status of a run in ``workdir`` (``python -m dew.main`` with ``argv``) that raised
    ``error``: a preempted run's (``dew.training.preemption.Preempted``: what was saved, on
    stderr, and where one landed the command that resumes it), else one short ``report``
    (the traceback under ``<workdir>/logs`` where that directory exists)."""
    from dew.training.preemption import Preempted

    if isinstance(error, Preempted):
        print(f"dew: {error}", file=sys.stderr, flush=True)
        if error.path is not None:
            print(f"dew: resume with: {resume_command(argv)}", file=sys.stderr, flush=True)
        return error.exit_code
    return report(error, workdir if os.path.isdir(workdir) else None)


def resume_command(argv: Sequence[str]) -> str:
    """The command that resumes a run: the same ``python -m dew.main`` arguments."""
    return " ".join(shlex.quote(a) for a in ["python", "-m", "dew.main", *argv])


class _LazyFileHandler(logging.FileHandler):
    """A file handler that creates its file (and directory) at the first record, not before."""

    def __init__(self, path: str):
        super().__init__(path, delay=True)

    def _open(self):
        os.makedirs(os.path.dirname(self.baseFilename), exist_ok=True)
        return super()._open()

    def handleError(self, record: logging.LogRecord) -> None:
        """A log that cannot be written (a full disk) is dropped, never printed to the console."""


def capture_library_logs(workdir: str) -> logging.Handler:
    """Send absl/orbax/asyncio log records, and exceptions that library threads (or ``__del__``
    methods) leave uncaught, to ``<workdir>/logs/dew.log`` instead of the console; return
    the handler. Nothing is created until the first record arrives."""
    handler = _LazyFileHandler(os.path.join(workdir, "logs", "dew.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("absl", "orbax", "asyncio", "jax._src.distributed"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False

    def thread_failure(args: threading.ExceptHookArgs) -> None:
        # A library thread dying (e.g. an orbax writer once its event loop is closed) goes to the
        # log; the run's own failure is what reaches the console, from the loop's thread.
        logging.getLogger("orbax").error(
            "uncaught exception in thread %s",
            getattr(args.thread, "name", "?"),
            exc_info=args.exc_value if args.exc_value is not None else False,  # with its traceback
        )

    def unraisable(args) -> None:  # e.g. an exception in a library's __del__ at a failed write
        logging.getLogger("orbax").error(
            "unraisable exception in %r",
            args.object,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    threading.excepthook = thread_failure
    sys.unraisablehook = unraisable
    return handler


__all__ = [
    "BAD_INPUT",
    "capture_library_logs",
    "exit_code",
    "report",
    "resume_command",
    "root_cause",
    "run_failed",
    "short",
    "stop_process",
    "write_traceback",
]
