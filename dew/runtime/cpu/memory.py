"""Keep the memory a CPU step frees for the next step: glibc's malloc, tuned when the process starts.

XLA:CPU allocates each execution's temporary buffer as one block with ``malloc`` and frees it when
the execution ends: 90.6 MB per device for the digits race's train step (8×8, batch 128, two CPU
devices). glibc serves blocks that large with ``mmap`` and returns them with ``munmap``, so every
step maps its buffer anew and the kernel faults it in page by page: 44,000 minor faults and
~90 ms of kernel time per step there (``benchmarks/RESULTS.md``). Three glibc tunables keep it
instead (``TUNABLES``): one arena for every thread (``glibc.malloc.arena_max=1``), large blocks
from that heap rather than mappings of their own (``glibc.malloc.mmap_max=0``), and freed memory
returned to the system only beyond ``KEEP_FREED`` at the heap's top
(``glibc.malloc.trim_threshold``). The buffer is then faulted in once per run; the price is the
process keeping its peak heap.

They take effect only from the process's start. glibc fixes how many arenas it makes when the
first extra thread allocates (numpy's OpenBLAS pool does, at import), and an arena other than
the main one maps any block larger than its 64 MiB heap whatever ``mmap_max`` says. So
``with_kept_heap()`` restarts the running program in place (``os.execve``: same process id,
same arguments) with the tunables added to ``GLIBC_TUNABLES``; ``python -m dew.main`` calls it
first thing. It does nothing where the C library is not glibc, where the backend will not be the
CPU, or where ``GLIBC_TUNABLES`` already names one of the three (the user's setting stands:
``GLIBC_TUNABLES=glibc.malloc.arena_max=0`` keeps glibc's defaults).

Measured against the restart's former tunable, huge pages (``glibc.malloc.hugetlb=1``: the block
still mapped anew each step, in 2 MiB pages), on a 2-core AMD EPYC with nothing else running,
alternating fresh processes (``benchmarks/step_memory.py``): the race's step 166-179 ms against
191-209 ms, with 7 ms of kernel time a step against 46 ms. On the 16×16 U-Net
(``benchmarks/unet.py --net=16``) the two are level: 384-412 ms against 350-487 ms. Huge pages and
the kept heap together were slower than either (``benchmarks/RESULTS.md``).

A library call cannot restart its caller's program, so ``reuse_freed_memory()`` sets the same
three with ``mallopt`` in the running process (``dew.runtime.start`` calls it before JAX
starts, for a user's own loop). There numpy's and JAX's threads have usually made other arenas
already, and the device threads that land on them still map their block anew: on the race's
network it removed half the faults in one of three processes and none in the other two (22,000
and 44,000 a step, ``benchmarks/step_memory.py``). A user's script gets the whole effect by
calling ``with_kept_heap()`` as its first line.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Mapping

#: Freed memory at the heap's top is returned to the system only beyond this much.
KEEP_FREED = 1 << 30
#: glibc's tunables that keep a step's freed memory for the next step (module docstring).
TUNABLES = {
    "glibc.malloc.arena_max": "1",
    "glibc.malloc.mmap_max": "0",
    "glibc.malloc.trim_threshold": str(KEEP_FREED),
}
#: glibc's ``mallopt`` parameters (``malloc.h``) for the same three, in a running process.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8


def _is_glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _named(tunables: str) -> dict[str, str]:
    """``GLIBC_TUNABLES``' ``name=value`` items (``a=1:b=2``) as a mapping."""
    named = (item.partition("=") for item in tunables.split(":") if item)
    return {name: value for name, _, value in named}


def kept_heap_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """``environ`` with ``TUNABLES`` added to ``GLIBC_TUNABLES`` (after the user's own), or None
    when there is nothing to add: not glibc on Linux, or ``GLIBC_TUNABLES`` names one of them."""
    if not _is_glibc():
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if set(_named(tunables)) & set(TUNABLES):
        return None
    added = ":".join(f"{name}={value}" for name, value in TUNABLES.items())
    return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, added]))}


def with_kept_heap() -> None:
    """Restart this program with ``TUNABLES`` unless ``kept_heap_environment`` says there is
    nothing to add or the backend will not be the CPU; returns only then. Call it before the
    program does any work: the restart runs it again from the start."""
    from dew.runtime.backend import cpu_backend_expected

    environ = kept_heap_environment(os.environ)
    if environ is None or not cpu_backend_expected():  # the kept heap serves XLA:CPU's buffers alone
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, environ)


def kept_heap_in_effect(environ_file: str = "/proc/self/environ") -> bool:
    """Whether this process started with ``TUNABLES``' one arena (``glibc.malloc.arena_max=1``),
    read from the environment the process was started with (what glibc read), not from
    ``os.environ``."""
    try:
        with open(environ_file, "rb") as f:
            started_with = f.read().split(b"\0")
    except OSError:
        return False
    prefix = b"GLIBC_TUNABLES="
    lists = [item[len(prefix) :].decode(errors="replace") for item in started_with if item.startswith(prefix)]
    return any(_named(tunables).get("glibc.malloc.arena_max") == "1" for tunables in lists)


def reuse_freed_memory() -> bool:
    """Set ``TUNABLES``' three settings with glibc's ``mallopt`` in this running process (one
    arena, no mappings for large blocks, trim beyond ``KEEP_FREED``). Call it before the
    threads that allocate exist (before JAX starts its backend); where other threads made arenas
    already, the threads that land on them still map large blocks anew (module docstring).
    Returns whether glibc keeps freed memory here: True where the process started with the
    tunables (nothing to set), or where ``mallopt`` took all three; False elsewhere (not glibc on
    Linux), where nothing changes."""
    if not _is_glibc():
        return False
    if kept_heap_in_effect():
        return True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(
        mallopt(parameter, value) == 1
        for parameter, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, KEEP_FREED))
    )
