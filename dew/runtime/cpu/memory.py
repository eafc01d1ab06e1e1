"""Back the large blocks a CPU step allocates with transparent huge pages.

XLA:CPU allocates each execution's temporary buffer as one block with ``malloc`` and frees it when
the execution ends: 187 MB per device for the 16×16 EDM U-Net's train step at batch 64, 1.4 GB at
32×32×3. glibc serves blocks that large with ``mmap`` and returns them with ``munmap``, so every
step maps its temporary buffer anew and the kernel faults it in page by page: 91,500 minor faults
and ~0.15-0.2 s of kernel time per 16×16 step on two CPU devices, 700,000 faults and 1.2-1.7 s at
32×32 (``benchmarks/RESULTS.md``). With glibc's tunable ``glibc.malloc.hugetlb=1``
``malloc`` asks for transparent huge pages on the memory it maps (``madvise(MADV_HUGEPAGE)``), so
the same buffer costs ~1,100 faults of 2 MiB pages and the step 15-20 % less time, with no change
to which thread allocates where (compile time is unchanged).

glibc reads its tunables when the process starts, so ``with_huge_pages()`` restarts the running
program in place (``os.execve``: same process id, same arguments) with the tunable added to
``GLIBC_TUNABLES``. ``python -m dew.main`` calls it first thing. It does nothing where the C
library is not glibc, where the kernel's transparent huge pages are ``never``, or where
``GLIBC_TUNABLES`` already names ``glibc.malloc.hugetlb`` (``glibc.malloc.hugetlb=0`` opts out).

A library call cannot restart its caller's program, so ``reuse_freed_memory()`` removes the
per-step faults in the running process instead (``dew.runtime.start`` calls it before JAX
starts, for ``python -m dew.main`` and a user's own loop alike): glibc's ``mallopt`` makes every
thread allocate from one heap, serves large blocks from it rather than from their own mappings,
and keeps what a step frees for the next step. The temporary buffer is then faulted in once: on
the digits race's network (8×8, batch 128, two CPU devices) 44,000 minor faults and 90 ms of
kernel time per step became ~370 and 5 ms, and the step 214 ms became 179 ms, against 182 ms
with huge pages alone (``benchmarks/RESULTS.md``). It is not combined with huge pages: the kept
heap is in 4 KiB pages, and on the 16×16 U-Net's step huge pages alone (351-355 ms) beat both
together (370-443 ms), while without huge pages keeping the memory wins (424-460 against
451-528 ms). So it does nothing where the process started with the tunable
(``huge_pages_in_effect``): it acts in a user's script, or a run that opted out of huge pages.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb"
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
#: Freed memory at the heap's top is returned to the system only beyond this much.
KEEP_FREED = 1 << 30


def transparent_huge_pages_available(mode_file: str = THP_MODE) -> bool:
    """Whether the kernel grants transparent huge pages on request (mode ``always`` or ``madvise``)."""
    try:
        with open(mode_file) as f:
            mode = f.read()
    except OSError:
        return False
    return "[never]" not in mode


def huge_page_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """``environ`` with ``glibc.malloc.hugetlb=1`` added to ``GLIBC_TUNABLES``, or None when there is
    nothing to add: not glibc on Linux, no transparent huge pages, or the tunable already set."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(item.split("=", 1)[0] == TUNABLE for item in tunables.split(":") if item):
        return None
    if not transparent_huge_pages_available():
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, f"{TUNABLE}=1"]))}


def with_huge_pages() -> None:
    """Restart this program with ``glibc.malloc.hugetlb=1`` unless ``huge_page_environment`` says
    there is nothing to add; returns only then. Call it before the program does any work: the
    restart runs it again from the start."""
    from dew.runtime.backend import cpu_backend_expected

    environ = huge_page_environment(os.environ)
    if environ is None or not cpu_backend_expected():  # huge pages serve XLA:CPU's buffers alone
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, environ)


def huge_pages_in_effect(environ_file: str = "/proc/self/environ") -> bool:
    """Whether this process started with glibc's huge-pages tunable set (non-zero): read from the
    environment the process was started with (what glibc read), not from ``os.environ``."""
    try:
        with open(environ_file, "rb") as f:
            started_with = f.read().split(b"\0")
    except OSError:
        return False
    prefix = b"GLIBC_TUNABLES="
    lists = [item[len(prefix) :] for item in started_with if item.startswith(prefix)]
    settings = (tunable.partition(b"=") for tunables in lists for tunable in tunables.split(b":"))
    return any(name == TUNABLE.encode() and value not in (b"", b"0") for name, _, value in settings)


def reuse_freed_memory() -> bool:
    """Have glibc's ``malloc`` keep the large blocks a step frees for the next step, in this
    process: one arena for every thread (``M_ARENA_MAX`` 1), large blocks from that heap instead
    of mappings of their own (``M_MMAP_MAX`` 0), and freed memory kept unless more than
    ``KEEP_FREED`` is free at the heap's top (``M_TRIM_THRESHOLD``). Call it before the threads
    that allocate exist (before JAX starts its backend): a thread's arena is fixed when it first
    allocates. The price: the process keeps its peak heap. Returns whether it was applied: glibc
    on Linux only, and not where the process started with huge pages (``huge_pages_in_effect``:
    they are faster alone, module docstring); elsewhere nothing changes."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or huge_pages_in_effect():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(
        mallopt(parameter, value) == 1
        for parameter, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, KEEP_FREED))
    )
