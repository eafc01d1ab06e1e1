"""``dew.runtime.cpu.memory``: a program that calls ``with_huge_pages()`` restarts once in place
with glibc's ``glibc.malloc.hugetlb=1``, after which a large block that a thread allocates, writes
and frees (as XLA:CPU's device threads do with each step's temporary buffer) is faulted in as
2 MiB pages instead of 4 KiB ones. Each case runs in a fresh process: glibc reads its tunables
when the process starts."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from dew.runtime.cpu import memory as host_memory
from dew.runtime.cpu.memory import TUNABLE, huge_page_environment

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
    from dew.runtime.cpu.memory import with_huge_pages
    with_huge_pages()
    {STEPS}
    print(json.dumps({{"pid": os.getpid(), "argv": sys.argv[1:], "tunables": os.environ.get("GLIBC_TUNABLES"),
                      "faults": faults, "page": resource.getpagesize()}}))
    """
)


def run_program(tunables: str | None) -> tuple[list[int], dict]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update({"GLIBC_TUNABLES": tunables} if tunables is not None else {})
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, "an-argument"], env=env, capture_output=True, text=True, check=True
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [line["started"] for line in lines if "started" in line], lines[-1]


needs_glibc_thp = pytest.mark.skipif(
    platform.system() != "Linux"
    or platform.libc_ver()[0] != "glibc"
    or not host_memory.transparent_huge_pages_available(),
    reason="glibc's malloc tunables and the kernel's transparent huge pages",
)


@needs_glibc_thp
def test_the_program_restarts_once_in_place_and_faults_the_block_in_huge_pages():
    starts, opted_out = run_program(f"{TUNABLE}=0")
    assert len(starts) == 1 and opted_out["tunables"] == f"{TUNABLE}=0"  # no restart when set
    starts, kept = run_program("glibc.malloc.check=0")
    # Restarted once, in place: the same process, its arguments, the user's tunables kept.
    assert len(starts) == 2 and starts[0] == starts[1] == kept["pid"], starts
    assert kept["argv"] == ["an-argument"]
    assert kept["tunables"] == f"glibc.malloc.check=0:{TUNABLE}=1"
    block_pages = (BLOCK_MIB << 20) // kept["page"]
    # A fresh 4 KiB mapping faults once per page: every step maps the block anew.
    assert all(f >= block_pages for f in opted_out["faults"]), opted_out
    # In 2 MiB pages the whole block is 100 faults (512x fewer); a quarter of block_pages is
    # reached only if most of the block still came in 4 KiB pages.
    assert all(f < block_pages // 4 for f in kept["faults"]), kept


def test_the_tunable_is_added_once_beside_the_users(monkeypatch):
    monkeypatch.setattr(host_memory.platform, "system", lambda: "Linux")
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(host_memory, "transparent_huge_pages_available", lambda: True)
    assert huge_page_environment({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": f"{TUNABLE}=1"}
    assert huge_page_environment({"GLIBC_TUNABLES": "glibc.malloc.check=0"}) == {
        "GLIBC_TUNABLES": f"glibc.malloc.check=0:{TUNABLE}=1"
    }
    for named in (f"{TUNABLE}=0", f"glibc.malloc.check=0:{TUNABLE}=1"):
        assert huge_page_environment({"GLIBC_TUNABLES": named}) is None  # the user's choice stands
    monkeypatch.setattr(host_memory, "transparent_huge_pages_available", lambda: False)
    assert huge_page_environment({}) is None
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))  # musl, or not Linux
    monkeypatch.setattr(host_memory, "transparent_huge_pages_available", lambda: True)
    assert huge_page_environment({}) is None


def test_the_kernels_mode_file_is_read(tmp_path):
    for mode, available in (("always [madvise] never", True), ("[always] madvise never", True)):
        (tmp_path / "enabled").write_text(mode + "\n")
        assert host_memory.transparent_huge_pages_available(str(tmp_path / "enabled")) is available
    (tmp_path / "enabled").write_text("always madvise [never]\n")
    assert not host_memory.transparent_huge_pages_available(str(tmp_path / "enabled"))
    assert not host_memory.transparent_huge_pages_available(str(tmp_path / "absent"))


REUSE_PROGRAM = textwrap.dedent(
    f"""
    import ctypes, json, resource, sys, threading
    from ml_collections import ConfigDict
    from dew.runtime import platform
    reuse = sys.argv[1] == "on"
    config = ConfigDict({{"runtime": {{**platform._DEFAULTS, "reuse_freed_memory": reuse}}}})
    started = platform.start(config, present_devices=False, detect_processes=False)
    {STEPS}
    applied, lines = started.reuses_freed_memory, started.lines()
    page = resource.getpagesize()
    print(json.dumps({{"faults": faults, "page": page, "applied": applied, "lines": lines}}))
    """
)


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt"
)
def test_freed_memory_is_reused_by_the_next_step_without_a_restart():
    """``dew.runtime.start`` (as a user's loop reaches it) makes glibc keep a step's freed block:
    only the first step faults it in; with ``config.runtime.reuse_freed_memory=False`` every step
    maps it anew. Huge pages off in both, so the faults are 4 KiB pages; a process started with
    them keeps them alone."""
    env = {**os.environ, "GLIBC_TUNABLES": f"{TUNABLE}=0"}
    results = {}
    for mode, tunable in (("on", "0"), ("off", "0"), ("on", "1")):
        done = subprocess.run(
            [sys.executable, "-c", REUSE_PROGRAM, mode],
            env={**env, "GLIBC_TUNABLES": f"{TUNABLE}={tunable}"},
            capture_output=True,
            text=True,
            check=True,
        )
        results[mode if tunable == "0" else "huge"] = json.loads(done.stdout.strip().splitlines()[-1])
    # Started with huge pages (as python -m dew.main restarts itself), they are kept alone.
    assert not results["huge"]["applied"]
    block_pages = (BLOCK_MIB << 20) // results["on"]["page"]
    on, off = results["on"], results["off"]
    assert on["applied"] and not off["applied"]
    assert any("config.runtime.reuse_freed_memory" in line for line in on["lines"])
    assert not any("reuse_freed_memory" in line for line in off["lines"])
    assert all(f >= block_pages for f in off["faults"]), off  # every step maps the block anew
    # The first step grows the heap by the block (less what its top already held, a few pages).
    assert on["faults"][0] > block_pages // 2
    assert all(f < block_pages // 4 for f in on["faults"][1:]), on  # the next ones reuse it


def test_huge_pages_in_effect_reads_the_environment_the_process_started_with(tmp_path):
    cases = {
        b"A=1\0GLIBC_TUNABLES=glibc.malloc.check=0:glibc.malloc.hugetlb=1\0": True,
        b"GLIBC_TUNABLES=glibc.malloc.hugetlb=2\0": True,
        b"GLIBC_TUNABLES=glibc.malloc.hugetlb=0\0": False,
        b"GLIBC_TUNABLES=glibc.malloc.check=1\0B=glibc.malloc.hugetlb=1\0": False,
        b"": False,
    }
    for started_with, expected in cases.items():
        (tmp_path / "environ").write_bytes(started_with)
        assert host_memory.huge_pages_in_effect(str(tmp_path / "environ")) is expected, started_with
    assert host_memory.huge_pages_in_effect(str(tmp_path / "absent")) is False
