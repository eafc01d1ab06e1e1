"""XLA:CPU's convolution library (``dew.runtime.cpu_convolutions``): which one ``auto`` picks, when
the flag is left alone, that a fresh process's XLA compiles with the choice, and that both
libraries compute the same convolution."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers_common import ROOT

from dew.runtime import cpu_convolutions
from dew.runtime.cpu_convolutions import (
    EIGEN_ROUTE,
    FLAG,
    convolutions_on_ynnpack,
    library_in_flags,
    route_convolutions,
    xla_knows_the_flag,
)

ZEN2 = {"AVX": True, "AVX2": True, "FMA3": True, "AVX512F": False}
AVX512 = {"AVX": True, "AVX2": True, "FMA3": True, "AVX512F": True}
AVX_ONLY = {"AVX": True, "AVX2": False, "AVX512F": False}


@pytest.mark.parametrize(
    ("flags", "library"),
    [
        ("", None),
        ("--xla_cpu_enable_fast_math=false", None),
        (EIGEN_ROUTE, "eigen"),
        (f"{FLAG}=-individual_convolution,+individual_convolution", "ynnpack"),
        (f"{FLAG}=-reduce", "ynnpack"),  # edits the default set, which keeps convolutions
        (f"{FLAG}=", "eigen"),  # no YNNPACK at all
        (f"{FLAG}=individual_dot,reduce", "eigen"),  # replaces the set
        (f"{FLAG}=individual_dot,individual_convolution", "ynnpack"),
        (f"{FLAG}=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT", "eigen"),  # the enum's full names
        (f"{FLAG}=-LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION", "eigen"),
        (f"{EIGEN_ROUTE} {FLAG}=+individual_convolution", "ynnpack"),  # the last one counts
    ],
)
def test_the_library_the_flags_choose(flags, library):
    assert library_in_flags(flags) == library
    assert convolutions_on_ynnpack(flags) == (library != "eigen")


@pytest.fixture
def fresh(monkeypatch):
    """A process whose backend has not started, with only an unrelated flag set."""
    monkeypatch.setattr(cpu_convolutions, "_backend_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    return monkeypatch


@pytest.mark.parametrize(
    ("features", "library"), [(ZEN2, "eigen"), (AVX512, "ynnpack"), (AVX_ONLY, "ynnpack"), ({}, "ynnpack")]
)
def test_auto_takes_eigen_only_where_it_was_measured_faster(fresh, features, library):
    fresh.setattr(cpu_convolutions, "cpu_features", lambda: features)
    assert route_convolutions("auto") == library
    expected = "--xla_cpu_enable_fast_math=false" + (f" {EIGEN_ROUTE}" if library == "eigen" else "")
    assert os.environ["XLA_FLAGS"] == expected
    assert route_convolutions("auto") == library  # idempotent: the flag now there wins
    assert os.environ["XLA_FLAGS"] == expected


def test_an_explicit_choice_applies_on_any_cpu(fresh):
    fresh.setattr(cpu_convolutions, "cpu_features", lambda: AVX512)
    assert route_convolutions("ynnpack") == "ynnpack"
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    assert route_convolutions("eigen") == "eigen"
    assert os.environ["XLA_FLAGS"] == f"--xla_cpu_enable_fast_math=false {EIGEN_ROUTE}"


def test_flags_already_set_or_a_started_backend_are_left_alone(fresh):
    fresh.setattr(cpu_convolutions, "cpu_features", lambda: ZEN2)
    fresh.setenv("XLA_FLAGS", f"{FLAG}=+individual_convolution")
    assert route_convolutions("eigen") == "ynnpack"  # the user's flag wins
    assert os.environ["XLA_FLAGS"] == f"{FLAG}=+individual_convolution"
    fresh.setenv("XLA_FLAGS", "")
    fresh.setattr(cpu_convolutions, "_backend_started", lambda: True)
    assert route_convolutions("auto") == "ynnpack"  # too late: XLA has read its flags
    assert os.environ["XLA_FLAGS"] == ""


def test_bad_choices_and_an_xla_without_the_flag_are_named(fresh):
    with pytest.raises(
        ValueError,
        match=r"config.runtime.cpu_convolutions must be one of 'auto', 'eigen', 'ynnpack', got 'fast'",
    ):
        route_convolutions("fast")
    fresh.setattr(cpu_convolutions, "cpu_features", lambda: ZEN2)
    fresh.setattr(cpu_convolutions, "xla_knows_the_flag", lambda: False)
    assert route_convolutions("auto") == "ynnpack"  # XLA would abort on a flag it does not know
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    with pytest.raises(
        ValueError, match="this jaxlib's XLA has no --xla_cpu_experimental_ynn_fusion_type flag"
    ):
        route_convolutions("eigen")


def test_the_installed_xla_knows_the_flag():
    assert xla_knows_the_flag()


CONVOLVE = """
import json, sys
import numpy as np
from dew.runtime.cpu_convolutions import route_convolutions
library = route_convolutions(sys.argv[1])
import jax
rng = np.random.default_rng(0)
x, w = rng.standard_normal((4, 16, 16, 32), np.float32), rng.standard_normal((3, 3, 32, 32), np.float32)
numbers = ("NHWC", "HWIO", "NHWC")
conv = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=numbers))
np.save(sys.argv[2], np.asarray(conv(x, w)))
print(json.dumps({"library": library}))
"""


def _convolve(choice: str, tmp_path) -> tuple[str, np.ndarray, str]:
    """(library, the convolution's output, XLA's dumped debug options of the program) in a fresh process."""
    dump = tmp_path / f"dump_{choice}"
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}", "PYTHONPATH": str(ROOT)}
    out = tmp_path / f"{choice}.npy"
    run = subprocess.run(
        [sys.executable, "-c", CONVOLVE, choice, str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    (options,) = [p for p in dump.iterdir() if "jit__lambda" in p.name and p.name.endswith(".debug_options")]
    return json.loads(run.stdout.splitlines()[-1])["library"], np.load(out), options.read_text()


def test_a_fresh_process_compiles_with_the_library_chosen_and_both_agree(tmp_path):
    eigen, y_eigen, options_eigen = _convolve("eigen", tmp_path)
    ynnpack, y_ynnpack, options_ynnpack = _convolve("ynnpack", tmp_path)
    assert (eigen, ynnpack) == ("eigen", "ynnpack")
    # XLA's debug options as it compiled the program: convolutions dropped from YNNPACK's set.
    types = [line.split(":")[1].strip() for line in options_eigen.splitlines() if "ynn_fusion_type" in line]
    assert (
        "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION" not in types
        and "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT" in types
    )
    assert "ynn_fusion_type" not in options_ynnpack  # XLA's default set, convolutions included
    # The same sums in another order: each output within float32 rounding of n = 3·3·32 products,
    # |Σ - fl(Σ)| ≤ γ_n Σ|x||w| for each (Higham, Accuracy and Stability, eq. 3.5), so the two
    # differ by at most 2 γ_n Σ|x||w|.
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 16, 16, 32), np.float32), rng.standard_normal((3, 3, 32, 32), np.float32)
    xp = np.pad(np.abs(x).astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    magnitude = sum(
        np.einsum("bhwc,co->bhwo", xp[:, i : i + 16, j : j + 16], np.abs(w[i, j]).astype(np.float64))
        for i in range(3)
        for j in range(3)
    )
    n, u = 3 * 3 * 32, np.finfo(np.float32).eps / 2
    assert np.all(np.abs(y_eigen.astype(np.float64) - y_ynnpack) <= 2 * n * u / (1 - n * u) * magnitude)
