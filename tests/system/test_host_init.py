"""The fresh state built on the host's CPU and placed (``config.runtime.fresh_state``): the same
state as the devices build, on the same shardings, and a run steps from it; ``auto`` picks the
host only for one process on accelerators with no step compiling beside it."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers_common import tiny_config

from dew.config import ConfigError
from dew.training import host_init
from dew.training.host_init import builds_on_host
from dew.training.trainer import Trainer


def fresh(tmp_path, where: str, monkeypatch):
    config = tiny_config(**{"mesh.devices": 0, "mesh.model": 2, "runtime.fresh_state": where})
    trainer = Trainer(config, str(tmp_path / where))
    built = []
    for name in ("init", "host_init"):  # which of the two programs the Trainer runs
        program = getattr(trainer.programs, name)
        monkeypatch.setattr(trainer.programs, name, lambda *a, p=program, n=name: built.append(n) or p(*a))
    return trainer, trainer.initial_state(), built


def test_the_host_builds_the_devices_state_on_their_shardings(tmp_path, monkeypatch):
    trainer, on_host, built = fresh(tmp_path, "host", monkeypatch)
    assert built == ["host_init"]
    _, on_devices, built = fresh(tmp_path, "devices", monkeypatch)
    assert built == ["init"]
    host_leaves, device_leaves = jax.tree.leaves(on_host), jax.tree.leaves(on_devices)
    assert len(host_leaves) == len(device_leaves) > 10
    assert len(jax.devices()) == 8 and dict(trainer.mesh.shape) == {"data": 4, "model": 2}
    for a, b in zip(host_leaves, device_leaves, strict=True):
        assert a.sharding == b.sharding and a.dtype == b.dtype
        # One program, the CPU's arithmetic on the same threefry bits both ways: the same bits.
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    state, stats = trainer.step(on_host, next(iter(trainer.train_data)))  # donated, then stepped
    assert np.isfinite(float(stats["loss"])) and int(state.step) == 1


def test_auto_is_the_host_for_one_process_on_accelerators(monkeypatch):
    assert builds_on_host("auto") is False  # the CPU: its own devices build it
    assert builds_on_host("host") is True and builds_on_host("devices") is False
    monkeypatch.setattr(host_init.jax, "default_backend", lambda: "tpu")
    assert builds_on_host("auto") is True
    assert builds_on_host("auto", beside_compile=True) is False  # Trainer.train: the devices'
    assert builds_on_host("host", beside_compile=True) is True
    monkeypatch.setattr(host_init.jax, "process_count", lambda: 2)
    assert builds_on_host("auto") is False  # each process builds only its shards on its devices
    monkeypatch.setattr(host_init, "host_cpu", lambda: None)  # JAX_PLATFORMS=tpu: no CPU backend
    assert builds_on_host("host") is False
    with pytest.raises(ValueError, match="fresh_state='gpu'"):
        builds_on_host("gpu")


def test_an_unknown_choice_is_refused_before_anything_is_built(tmp_path):
    with pytest.raises(ConfigError, match="fresh_state"):
        Trainer(tiny_config(**{"runtime.fresh_state": "disk"}), str(tmp_path / "run"))
