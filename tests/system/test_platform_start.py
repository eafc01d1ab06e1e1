"""``dew.runtime.start`` reaches every entry point: a ``Trainer``, ``dew.pipeline`` or
``evaluate`` built in a user's own code before JAX started applies it itself (the clean-environment
tier, ``tests/user_paths``, checks that in a fresh environment); built after JAX started,
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


def test_a_trainer_built_after_jax_started_warns_at_the_line_that_built_it(not_started, config, tmp_path):
    """The warning points at the user's line (``warnings``' default filter shows it once per line),
    not at dew's own code."""
    from dew.training.trainer import Trainer

    with pytest.warns(platform.PlatformNotApplied, match="Trainer built after JAX started") as seen:
        trainer = Trainer(config, str(tmp_path / "run"))
    assert trainer.platform is None
    assert [w.filename for w in seen] == [__file__]


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


WARM = """
import json, sys
import jax, jax.numpy as jnp
from jax import monitoring

events = []
monitoring.register_event_listener(lambda name, **kw: events.append(name))
from dew.runtime import start

platform = start(workdir=sys.argv[1])
jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.ones(3)).block_until_ready()
print(json.dumps({"directory": platform.compilation_cache, "events": events}))
"""


def test_a_warm_machine_cache_skips_compiling(tmp_path):
    """The machine's compilation cache by default: a program one run compiled is not compiled
    again by a run in a new workdir (a cache hit, no miss); ``DEW_CACHE_DIR=off`` keeps each
    run's own ``cache/jax``."""
    import json
    import os
    import subprocess
    import sys

    from helpers_common import ROOT

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "home")}
    env["JAX_PLATFORMS"] = "cpu"

    def run(workdir, **extra):
        done = subprocess.run(
            [sys.executable, "-c", WARM, str(tmp_path / workdir)],
            env={**env, **extra},
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold, warm = run("first"), run("second")
    machine = str(tmp_path / "home" / ".cache" / "dew" / "jax")
    assert cold["directory"] == warm["directory"] == machine
    assert "/jax/compilation_cache/cache_misses" in cold["events"]
    assert "/jax/compilation_cache/cache_hits" in warm["events"]
    assert "/jax/compilation_cache/cache_misses" not in warm["events"]
    apart = run("third", DEW_CACHE_DIR="off")
    assert apart["directory"] == str(tmp_path / "third" / "cache" / "jax")
    assert "/jax/compilation_cache/cache_misses" in apart["events"]
