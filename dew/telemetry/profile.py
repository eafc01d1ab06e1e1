"""``profile``: native (XLA/JAX) profiler capture into a directory, started only on demand.

Constructing a ``profile`` configures a capture and starts nothing; capture starts on ``with``
entry or ``start()`` and ends on exit or ``stop()``. The trace lands under
``directory/plugins/profile/<run>/`` as the XPlane protobuf TensorBoard's profiler reads, plus a
Perfetto ``*.trace.json.gz`` (``perfetto=True``) that any JSON reader can inspect.
"""

from __future__ import annotations

import glob
import os
from types import TracebackType

import jax


class profile:  # a context manager used like a function: ``with profile(dir):``
    """Configure native profiling; capture starts only on enter or ``start()``.

    One capture at a time per process (JAX's profiler is global): starting a second raises.
    ``stop()`` first waits for ``block_on`` (e.g. the latest train state) so the device work
    dispatched inside the window is in the trace, not cut off by asynchronous dispatch.

    ``python=False`` (the default) leaves out the Python function tracer: it records every
    Python call (an asynchronous checkpoint save alone is ~10⁶ events, past the trace's event
    cap, which then silently drops later step annotations) and slows the loop it measures.
    Host annotations (``StepTraceAnnotation``, ``TraceAnnotation``) and device work are kept.
    """

    def __init__(self, directory: str, *, perfetto: bool = True, python: bool = False):
        self.directory = os.path.abspath(directory)
        self.perfetto = perfetto
        self.python = python
        self.active = False

    def start(self) -> None:
        if self.active:
            raise RuntimeError(f"profile({self.directory!r}) is already capturing")
        os.makedirs(self.directory, exist_ok=True)
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = int(self.python)
        jax.profiler.start_trace(
            self.directory, create_perfetto_trace=self.perfetto, profiler_options=options
        )
        self.active = True

    def stop(self, block_on: object = None) -> None:
        if not self.active:
            raise RuntimeError(f"profile({self.directory!r}) is not capturing; call start() first")
        if block_on is not None:
            jax.block_until_ready(block_on)
        try:
            jax.profiler.stop_trace()
        finally:
            self.active = False

    def traces(self) -> list[str]:
        """Trace files written under the directory so far (XPlane and Perfetto), oldest first."""
        found = glob.glob(os.path.join(self.directory, "plugins", "profile", "*", "*"))
        return sorted(
            (p for p in found if p.endswith((".xplane.pb", ".trace.json.gz"))), key=os.path.getmtime
        )

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.active:
            self.stop()
