"""XLA:CPU's convolution library (``dew.runtime.cpu.flags``): which one ``auto`` picks and
when the flag is left alone. (A fresh process's XLA compiling with the choice, and both libraries
computing the same convolution: tests/system/test_cpu_convolutions_process.py.)"""

from __future__ import annotations

import os

import pytest

from dew.runtime.cpu import flags as cpu_convolutions
from dew.runtime.cpu.flags import (
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
    """The pinned jaxlib has the flag (XLA aborts a process given a flag it does not know, so the
    route is added only where this finds it), and the search finds no flag that is not there."""
    assert xla_knows_the_flag()
    assert not cpu_convolutions._jaxlib_has(b"xla_cpu_no_such_flag_anywhere")
