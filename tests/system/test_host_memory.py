"""``dew.runtime.cpu.memory``: a program that calls ``with_kept_heap()`` restarts once in place
with glibc's malloc tunables (one arena, no mappings for large blocks, trim beyond 1 GiB), after
which a large block that a thread allocates, writes and frees (as XLA:CPU's device threads do
with each step's temporary buffer) is faulted in by the first step only; without them every
step maps it anew. Each case runs in a fresh process: glibc reads its tunables when the process
starts."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from dew.runtime.cpu import memory as host_memory
from dew.runtime.cpu.memory import TUNABLES, kept_heap_environment

BLOCK_MIB = 200

#: Three steps, each on a new thread, allocating, writing and freeing the block as an XLA:CPU
#: execution does with its temporary buffer; ``faults``: the minor faults of each.
STEPS = textwrap.indent(
    textwrap.dedent(
        f"""\
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        faults = []

        def step():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            block = libc.malloc({BLOCK_MIB} << 20)
            ctypes.memset(block, 1, {BLOCK_MIB} << 20)
            libc.free(block)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

        for _ in range(3):
            thread = threading.Thread(target=step)
            thread.start()
            thread.join()
        """
    ),
    "    ",
).strip()

PROGRAM = textwrap.dedent(
    f"""
    import ctypes, json, os, resource, sys, threading
    print(json.dumps({{"started": os.getpid()}}), flush=True)
    from dew.runtime.cpu.memory import with_kept_heap
    with_kept_heap()
    {STEPS}
    print(json.dumps({{"pid": os.getpid(), "argv": sys.argv[1:], "tunables": os.environ.get("GLIBC_TUNABLES"),
                      "faults": faults, "page": resource.getpagesize()}}))
    """
)

#: What the restart adds to GLIBC_TUNABLES.
ADDED = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824"


def run_program(tunables: str | None) -> tuple[list[int], dict]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update({"GLIBC_TUNABLES": tunables} if tunables is not None else {})
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, "an-argument"], env=env, capture_output=True, text=True, check=True
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [line["started"] for line in lines if "started" in line], lines[-1]


needs_glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc tunables"
)


@needs_glibc
def test_the_program_restarts_once_in_place_and_keeps_the_freed_block():
    starts, opted_out = run_program("glibc.malloc.arena_max=0")
    assert len(starts) == 1 and opted_out["tunables"] == "glibc.malloc.arena_max=0"  # no restart when named
    starts, kept = run_program("glibc.malloc.check=0")
    # Restarted once, in place: the same process, its arguments, the user's tunables kept first.
    assert len(starts) == 2 and starts[0] == starts[1] == kept["pid"], starts
    assert kept["argv"] == ["an-argument"]
    assert kept["tunables"] == f"glibc.malloc.check=0:{ADDED}"
    block_pages = (BLOCK_MIB << 20) // kept["page"]
    # glibc's defaults: a fresh mapping faults once per page, and every step maps the block anew.
    assert all(f >= block_pages for f in opted_out["faults"]), opted_out
    # Kept: the first step grows the heap by the block (less what its top held, a few pages);
    # the next ones, each on a new thread, reuse it.
    assert kept["faults"][0] > block_pages // 2, kept
    assert all(f < block_pages // 4 for f in kept["faults"][1:]), kept


def test_the_tunables_are_added_once_after_the_users(monkeypatch):
    monkeypatch.setattr(host_memory.platform, "system", lambda: "Linux")
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert ":".join(f"{k}={v}" for k, v in TUNABLES.items()) == ADDED
    assert kept_heap_environment({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": ADDED}
    assert kept_heap_environment({"GLIBC_TUNABLES": "glibc.malloc.check=0"}) == {
        "GLIBC_TUNABLES": f"glibc.malloc.check=0:{ADDED}"
    }
    for named in ("glibc.malloc.arena_max=0", "glibc.malloc.check=0:glibc.malloc.mmap_max=65536", ADDED):
        assert kept_heap_environment({"GLIBC_TUNABLES": named}) is None  # the user's choice stands
    assert kept_heap_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) == {
        "GLIBC_TUNABLES": f"glibc.malloc.hugetlb=1:{ADDED}"
    }
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))  # musl, or not Linux
    assert kept_heap_environment({}) is None


REUSE_PROGRAM = textwrap.dedent(
    f"""
    import ctypes, json, resource, sys, threading
    from ml_collections import ConfigDict
    from dew.runtime import platform
    mode = sys.argv[1]
    if mode == "early":  # a thread that allocated before start (as numpy's OpenBLAS pool does): its own arena
        parked, release = threading.Event(), threading.Event()
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        def early():
            libc.free(libc.malloc(1 << 16))
            parked.set()
            release.wait()
        threading.Thread(target=early, daemon=True).start()
        parked.wait()
    config = ConfigDict({{"runtime": {{**platform._DEFAULTS, "reuse_freed_memory": mode != "off"}}}})
    started = platform.start(config, present_devices=False, detect_processes=False)
    {STEPS}
    applied, lines = started.freed_memory is not None, started.lines()
    page = resource.getpagesize()
    print(json.dumps({{"faults": faults, "page": page, "applied": applied, "lines": lines}}))
    """
)


@needs_glibc
def test_freed_memory_is_reused_by_the_next_step_without_a_restart():
    """``dew.runtime.start`` (as a user's loop reaches it) sets the same settings with ``mallopt``:
    only the first step faults the block in; with ``config.runtime.reuse_freed_memory=False``
    every step maps it anew. Where a thread made its own arena before (``early``), a step's
    thread that lands on it still maps the block anew: why ``python -m dew.main`` restarts with
    the tunables instead. A process started with them sets nothing and says so."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    results = {}
    for mode, tunables in (("on", None), ("off", None), ("early", None), ("started", ADDED)):
        done = subprocess.run(
            [sys.executable, "-c", REUSE_PROGRAM, mode],
            env={**env, **({"GLIBC_TUNABLES": tunables} if tunables else {})},
            capture_output=True,
            text=True,
            check=True,
        )
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    block_pages = (BLOCK_MIB << 20) // results["on"]["page"]
    on, off, early, started = results["on"], results["off"], results["early"], results["started"]
    assert on["applied"] and not off["applied"] and early["applied"] and started["applied"]
    assert any("(config.runtime.reuse_freed_memory)" in line for line in on["lines"])
    assert any("started with glibc's malloc tunables" in line for line in started["lines"])
    assert not any("glibc keeps" in line for line in off["lines"])
    assert all(f >= block_pages for f in off["faults"]), off  # every step maps the block anew
    for kept in (on, started):
        # The first step grows the heap by the block (less what its top already held, a few pages).
        assert kept["faults"][0] > block_pages // 2, kept
        assert all(f < block_pages // 4 for f in kept["faults"][1:]), kept  # the next ones reuse it
    # Two arenas, shared in turn: the steps that land on the early thread's map the block anew.
    assert any(f >= block_pages for f in early["faults"][1:]), early


def test_kept_heap_in_effect_reads_the_environment_the_process_started_with(tmp_path):
    cases = {
        f"A=1\0GLIBC_TUNABLES=glibc.malloc.check=0:{ADDED}\0".encode(): True,
        b"GLIBC_TUNABLES=glibc.malloc.arena_max=1\0": True,
        b"GLIBC_TUNABLES=glibc.malloc.arena_max=0\0": False,
        b"GLIBC_TUNABLES=glibc.malloc.hugetlb=1\0": False,
        b"GLIBC_TUNABLES=glibc.malloc.check=1\0B=glibc.malloc.arena_max=1\0": False,
        b"": False,
    }
    for started_with, expected in cases.items():
        (tmp_path / "environ").write_bytes(started_with)
        assert host_memory.kept_heap_in_effect(str(tmp_path / "environ")) is expected, started_with
    assert host_memory.kept_heap_in_effect(str(tmp_path / "absent")) is False
