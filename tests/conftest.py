"""The suite's set-up (CPU only, a persistent compilation cache, XLA flags), its markers, hooks and
fixtures. Helpers that test files import live in helpers_*.py modules, never here."""

from __future__ import annotations

import os

import pytest
from helpers_common import ROOT, tiny_config

CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One BLAS thread per test process: `make test` runs one worker per core, and two OpenBLAS threads
# per worker on two cores spin against each other (numpy's eigh in a 2048-d Fréchet distance: 6 s
# with one thread, 29 s with two, the other core busy). Set before anything loads numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# The suite never reads or writes the machine's dew folder, ~/.cache/dew (tests that need one
# point DEW_CACHE_DIR at a temporary folder).
os.environ["DEW_CACHE_DIR"] = "off"
# Eight CPU devices in every test process, so sharding tests need no process of their own.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
# The suite is compile-bound: its programs are tiny and run a few steps, so LLVM's optimisation of
# XLA:CPU's generated code costs more than it saves (cold cache, 2 cores: a CLI training test and a
# video run 114 s -> 49 s wall). The HLO passes (fusion, layout) are the same at every level, and no
# test compares bits across programs compiled with different flags. A given level is kept.
# Level 0 changes the last bits of generated elementwise code (no FMA contraction): a test that
# compares bits with a recording of the default program is marked ``default_compiler`` and runs in
# a child pytest without it (``pytest_pyfunc_call`` below). So does a test marked
# ``execution_bound``: one that trains for a thousand steps or more, where the default level's
# faster code saves more than its compile and the child's start-up cost (cold cache, 2 cores: the
# two mixture-training tests 51 + 49 s -> 35 + 39 s). The parent sets the test's fixtures up too,
# so the marker is for tests whose fixtures cost nothing (a module fixture that trains a run would
# train it twice).
FAST_COMPILE = "--xla_backend_optimization_level=0"
DEFAULT_COMPILER_CHILD = "DEW_TEST_DEFAULT_COMPILER"
if (
    os.environ.get(DEFAULT_COMPILER_CHILD) != "1"
    and "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]
):
    os.environ["XLA_FLAGS"] += f" {FAST_COMPILE}"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "default_compiler: compares bits with the default XLA:CPU program; runs in a child pytest"
    )
    config.addinivalue_line(
        "markers",
        "execution_bound: trains long enough that XLA's default optimisation pays; runs in a child pytest",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A ``default_compiler`` or ``execution_bound`` test runs as a child pytest of just that
    test, with XLA's default backend optimisation; its failure output is this test's failure."""
    marked = any(pyfuncitem.get_closest_marker(m) for m in ("default_compiler", "execution_bound"))
    if not marked or os.environ.get(DEFAULT_COMPILER_CHILD) == "1":
        return None
    import subprocess
    import sys

    flags = " ".join(f for f in os.environ["XLA_FLAGS"].split() if f != FAST_COMPILE)
    env = {**os.environ, "XLA_FLAGS": flags, DEFAULT_COMPILER_CHILD: "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        pyfuncitem.nodeid,
    ]
    child = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if child.returncode != 0:
        pytest.fail(
            "in a child pytest with XLA's default optimisation:\n"
            f"{child.stdout[-6000:]}{child.stderr[-2000:]}"
        )
    return True


@pytest.fixture
def config():
    return tiny_config()


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    """Converted Inception weights (not pinned) for the module's tests: helpers_fid's random ones."""
    from helpers_fid import random_state_dict

    from dew.scoring import convert_inception

    path = tmp_path_factory.mktemp("w") / "inception.npz"
    convert_inception.convert(random_state_dict(), str(path), source_sha256="0" * 64)
    return path


@pytest.fixture
def machine(monkeypatch):
    """For the kernel choice's tests: this jaxlib knows the Eigen route; the CPU and jaxlib are
    named as the test says (``dew.runtime.cpu.choice``)."""
    from dew.runtime.cpu import choice as kernel_choice
    from dew.runtime.cpu import flags

    monkeypatch.setattr(flags, "xla_knows_the_flag", lambda: True)
    monkeypatch.setattr(kernel_choice, "cpu_model", lambda: "Test CPU (family 1, model 1, 2 cores)")
    monkeypatch.setattr(kernel_choice, "jaxlib_version", lambda: "0.10.2")
    return monkeypatch
