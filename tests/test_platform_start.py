"""``dew.runtime.start`` reaches every entry point: a ``Trainer``, ``dew.pipeline`` or
``evaluate`` built in a user's own code before JAX started applies it itself (the clean-environment
tier, ``tests/user_paths``, checks that with the measurement running); built after JAX started,
one ``PlatformNotApplied`` warning says what was missed and how to get it."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

from dew.runtime import platform
from dew.training.evaluation import evaluate


@pytest.fixture
def not_started(monkeypatch):
    jax.devices()  # this process's backend has started (as in any test process)
    monkeypatch.setattr(platform, "_started", None)


def test_built_after_jax_started_one_warning_says_what_was_missed(not_started):
    with pytest.warns(platform.PlatformNotApplied, match=r"dew\.runtime\.start\(config, workdir\)") as seen:
        assert platform.start_for("Trainer") is None
    assert len(seen) == 1 and "Trainer built after JAX started" in str(seen[0].message)


def test_evaluate_in_a_custom_loop_says_it_too(not_started):
    batches = [{"x": np.ones((2, 1), np.float32)}]
    with pytest.warns(platform.PlatformNotApplied, match="evaluate built after JAX started"):
        out = evaluate(
            lambda state, batch, rng: {"loss": batch["x"].sum()}, None, batches, 1, jax.random.key(0)
        )
    assert out["loss"] == 2.0


def test_after_start_nothing_is_said(monkeypatch):
    monkeypatch.setattr(platform, "_started", object())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert platform.start_for("Trainer") is None
