"""Console output: a one-line progress display, and line/table metric loggers.

On a terminal the progress line rewrites itself in place; when stdout is not a TTY (CI, a log
file) it prints a summary line every ``summary_every`` seconds instead of a scroll per step.
Events between progress lines (an evaluation, a preview, a new best checkpoint) are one line
each, in the progress line's style, printed when they happen (``Progress.report``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np

from dew.tracking.base import LoggingCategory, convert_mse_to_rmse, is_scalar, to_float


def _format(value: Any) -> str:
    """Numbers to 4 significant digits; an array (a histogram's values) as its shape and mean,
    so one wide value cannot flood the console."""
    if is_scalar(value):
        number = to_float(value)
        return str(int(number)) if isinstance(value, int | np.integer) else f"{number:.4g}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        array = np.asarray(value)
        mean = f" mean={float(array.mean()):.4g}" if array.size and array.dtype.kind in "fiub" else ""
        return f"array{list(array.shape)}{mean}"
    return str(value)


def log_metrics_to_line(
    category: LoggingCategory, to_log: dict[str, Any], step_number: int, stream: TextIO | None = None
) -> None:
    """Log metrics on a single line, MSE keys converted to RMSE.

    A logger callback: attach it to ``Trackers`` (``trackers.attach(log_metrics_to_line)``) and
    every report, of every category, is printed as ``[<category> step <n>] key=value ...``.
    """
    values = convert_mse_to_rmse(to_log)
    body = "  ".join(f"{k}={_format(v)}" for k, v in sorted(values.items()))
    print(f"[{category.value} step {step_number}] {body}", file=stream or sys.stdout, flush=True)


def log_metrics_to_table(
    category: LoggingCategory, to_log: dict[str, Any], step_number: int, stream: TextIO | None = None
) -> None:
    """Log metrics as a two-column table, MSE keys converted to RMSE (a logger callback, like
    ``log_metrics_to_line``)."""
    values = convert_mse_to_rmse(to_log)
    rows = [(k, _format(v)) for k, v in sorted(values.items())]
    width = max([len("metric"), *(len(k) for k, _ in rows)])
    vwidth = max([len("value"), *(len(v) for _, v in rows)])
    rule = f"+-{'-' * width}-+-{'-' * vwidth}-+"
    lines = [
        f"{category.value} metrics at step {step_number}",
        rule,
        f"| {'metric'.ljust(width)} | {'value'.ljust(vwidth)} |",
        rule,
    ]
    lines += [f"| {k.ljust(width)} | {v.rjust(vwidth)} |" for k, v in rows]
    lines.append(rule)
    print("\n".join(lines), file=stream or sys.stdout, flush=True)


def convert_mse_to_rmse_in_logs(to_log: dict[str, Any]) -> dict[str, Any]:
    """Convert metrics whose key contains ``mse_`` to ``rmse_`` by taking the square root.

    Applied at log time rather than during accumulation, because the square root must be taken
    after averaging rather than before. Returns a new dict; other entries are kept as they are.
    """
    return convert_mse_to_rmse(to_log)


class Progress:
    """steps/s, examples/s, ETA and the latest loss, on one line that updates."""

    def __init__(
        self, total_steps: int, batch_size: int, stream: TextIO | None = None, summary_every: float = 30.0
    ):
        self.total = total_steps
        self.batch_size = batch_size
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.summary_every = summary_every
        self._start_step: int | None = None
        self._start_time = 0.0
        self._last_summary = 0.0
        self._line = ""  # the progress line a terminal shows (redrawn under an event's line)

    def update(self, step: int, loss: float | None) -> None:
        now = time.perf_counter()
        if self._start_step is None:  # the first report includes the compile; rate from here.
            self._start_step, self._start_time, self._last_summary = step, now, now
            return
        elapsed = max(now - self._start_time, 1e-9)
        rate = (step - self._start_step) / elapsed
        eta = (self.total - step) / rate if rate > 0 else float("inf")
        line = (
            f"step {step}/{self.total}  {rate:.2f} steps/s  {rate * self.batch_size:.0f} ex/s  "
            f"ETA {_duration(eta)}" + ("" if loss is None else f"  loss {loss:.4f}")
        )
        if self.tty:
            self._line = line
            self.stream.write("\r" + line.ljust(100))
            self.stream.flush()
        elif now - self._last_summary >= self.summary_every or step == self.total:
            self._last_summary = now
            print(line, file=self.stream, flush=True)

    def report(self, step: int, event: str, values: Mapping[str, Any], note: str = "") -> None:
        """One line for an event at ``step``, printed at once, in the progress line's style:
        ``step <step>/<total>  <event>  <name> <value>  ...  <note>`` (values in name order, to
        4 significant digits, MSE keys as RMSE like the trackers'; ``note``, e.g. a file the
        event wrote, last). On a terminal the line goes above the progress line, which is
        redrawn under it."""
        fields = [f"step {step}/{self.total}", event]
        shown = convert_mse_to_rmse(values)  # as every tracker logs them
        fields += [f"{name} {_format(value)}" for name, value in sorted(shown.items())]
        if note:
            fields.append(note)
        line = "  ".join(fields)
        if self.tty:
            self.stream.write(
                "\r" + line.ljust(100) + "\n" + ("\r" + self._line.ljust(100) if self._line else "")
            )
            self.stream.flush()
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty and self._line:  # end the line the progress display rewrites
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
