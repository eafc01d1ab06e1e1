"""The kernel choice (``dew.runtime.cpu.choice``): a forced setting wins (and ``XLA_FLAGS`` over
it), a resumed run keeps what it recorded (per-class gradient forms included, handed to the
layers), the CPU-flag rule decides otherwise and says why, an accelerator decides nothing, and
``dew.runtime.start`` applies the decision, records it and starts no measurement child for a
U-Net."""

from __future__ import annotations

import json
import os

import pytest

from dew import kernels
from dew.runtime.cpu import cache as kernel_cache
from dew.runtime.cpu import choice as kernel_choice
from dew.runtime.cpu import flags as cpu_convolutions
from dew.runtime.cpu.choice import Decision, choose

CPU = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
BIG, SMALL = [32, 32, 64, 64, 3, 1], [8, 8, 32, 32, 3, 1]


def never(*_):
    raise AssertionError("no measurement child or trace for a run without a transformer's dots")


def choose_with(library="auto", gradient="auto", **kw):
    settings = {"shapes": None, "devices": 2, "cache": None, "environ": CPU, **kw}
    return choose(library, gradient, runner=never, tracer=never, **settings)


def test_a_forced_choice_wins_and_xla_flags_win_over_it(machine):
    forced = choose_with("ynnpack", "xla")
    assert (forced.library, forced.per_tap, forced.how) == ("ynnpack", frozenset(), "forced by config")
    every = choose_with("eigen", "per_tap")
    assert every.library == "eigen" and every.kernel_choice().per_tap_weight_gradient_from == 1
    flagged = {**CPU, "XLA_FLAGS": f"{CPU['XLA_FLAGS']} {cpu_convolutions.EIGEN_ROUTE}"}
    assert choose_with("ynnpack", "xla", environ=flagged).library == "eigen"
    with pytest.raises(ValueError, match="cpu_convolutions must be one of"):
        choose_with("mkl")
    with pytest.raises(ValueError, match="cpu_weight_gradient must be one of"):
        choose_with("auto", "im2col")


def test_the_rule_decides_auto_and_says_why(machine):
    """Without a recorded or forced choice the CPU-flag rule decides (Eigen only on x86 with AVX2
    and without AVX-512), and its line says so; nothing is timed for convolutions."""
    machine.setattr(cpu_convolutions, "eigen_measured_faster", lambda features=None: False)
    ruled = choose_with()
    assert ruled.library == "ynnpack" and ruled.how == "CPU-flag rule: convolutions are not timed"
    machine.setattr(cpu_convolutions, "eigen_measured_faster", lambda features=None: True)
    assert choose_with().library == "eigen"
    asked = choose_with(environ={**CPU, kernel_choice.BY_RULE_VARIABLE: "1"})
    assert asked.how == f"CPU-flag rule: {kernel_choice.BY_RULE_VARIABLE}=1 asks for no measurement"
    # No XLA_FLAGS at all (a newcomer's environment) is no error.
    assert choose("auto", "auto", shapes=None, devices=1, cache=None, environ={}).per_tap is None


def test_a_resumed_run_keeps_its_recorded_choice_forms_included(machine):
    forms = frozenset({(tuple(BIG), "im2col", "per_tap"), (tuple(SMALL), "xla", "im2col")})
    recorded = Decision("eigen", frozenset({tuple(BIG)}), "measured", None, forms, "onednn").record()
    resumed = choose_with(recorded=json.loads(json.dumps(recorded)), recorded_in="/w/run.json")
    assert (resumed.library, resumed.per_tap, resumed.forms, resumed.dots) == (
        "eigen",
        frozenset({tuple(BIG)}),
        forms,
        "onednn",
    )
    assert resumed.how == "recorded with the run's checkpoints in /w/run.json"
    assert "weight gradients per-tap for 1, im2col for 1 shape class(es)" in resumed.line()
    assert "input gradients im2col for 1 shape class(es)" in resumed.line()
    previous = kernels.current()
    try:
        kernels.set_choice(resumed.kernel_choice())
        assert kernels.convolution_forms(32 * 32, (32, 32, 64, 64, 3, 1)) == ("im2col", "per_tap")
        assert kernels.convolution_forms(8 * 8, (8, 8, 32, 32, 3, 1)) == ("xla", "im2col")
    finally:
        kernels.set_choice(previous)
    told = choose_with("ynnpack", "xla", recorded=recorded)
    assert (told.library, told.per_tap) == ("ynnpack", frozenset())  # told otherwise: the config wins
    half = choose_with("auto", "xla", recorded=recorded)
    assert half.library == "eigen" and half.per_tap == frozenset() and "forced by config" in half.how


def test_an_accelerator_decides_nothing(machine):
    decision = choose_with(devices=1, environ={"JAX_PLATFORMS": "cuda"})
    assert decision.library == "ynnpack" and "not the CPU" in decision.how
    assert not kernel_choice.cpu_backend_expected({"JAX_PLATFORMS": "tpu,cpu"})
    assert kernel_choice.cpu_backend_expected({"JAX_PLATFORMS": "cpu"})


def test_start_applies_records_and_resumes_a_u_net_without_measuring(machine, tmp_path):
    """``dew.runtime.start`` with a SongUNet run config: the rule's choice reaches the layers and
    run.json's record, no child or trace runs and no kernel cache is written; a record resumes."""
    from ml_collections import ConfigDict

    from dew.runtime import backend, platform
    from dew.runtime.cpu import devices, dots, setup

    machine.setattr(dots, "run_probe", never)
    machine.setattr(devices, "backend_started", lambda: False)
    machine.setattr(backend, "backend_started", lambda: False)
    machine.setattr(cpu_convolutions, "_backend_started", lambda: False)
    machine.setattr(cpu_convolutions, "eigen_measured_faster", lambda features=None: True)
    machine.setenv("XLA_FLAGS", CPU["XLA_FLAGS"])
    machine.setenv("JAX_PLATFORMS", "cpu")
    machine.delenv(kernel_choice.BY_RULE_VARIABLE, raising=False)  # the suite's own setting
    machine.setenv(kernel_cache.MACHINE_CACHE_VARIABLE, str(tmp_path / "machine"))
    config = ConfigDict(
        {
            "runtime": {
                "host_devices": 0,
                "cpu_convolutions": "auto",
                "cpu_weight_gradient": "auto",
                "compilation_cache": "off",
                "coordinator_timeout": 300,
                "heartbeat_timeout": 100,
            },
            "model": {"name": "songunet", "model_channels": 32},
            "dataset": {"name": "digits", "batch_size": 64},
            "train": {"accumulation": 1},
        }
    )
    previous, applied = kernels.current(), setup._applied
    try:
        first = platform.start(config, str(tmp_path), dots=lambda config, count: None)
        assert first.decision is not None
        assert first.convolutions == "eigen" and first.decision.library == "eigen"
        assert os.environ["XLA_FLAGS"].endswith(cpu_convolutions.EIGEN_ROUTE)
        assert any(line.startswith("kernel choice: convolutions on eigen") for line in first.lines())
        record = first.kernels_record()
        assert record is not None and record["library"] == "eigen" and record["cpu"].startswith("Test CPU")
        assert not (tmp_path / "cache").exists() and not (tmp_path / "machine").exists()
        machine.setenv("XLA_FLAGS", CPU["XLA_FLAGS"])
        resumed = platform.start(config, str(tmp_path), recorded={"library": "ynnpack", "per_tap": [BIG]})
        assert resumed.decision is not None
        assert resumed.convolutions == "ynnpack" and "recorded" in resumed.decision.how
        assert kernels.current().per_tap_convolutions == frozenset({tuple(BIG)})
    finally:
        kernels.set_choice(previous)
        machine.setattr(setup, "_applied", applied)


def test_route_dots_adds_the_flags_once_and_leaves_the_users(monkeypatch):
    monkeypatch.setattr(cpu_convolutions, "_backend_started", lambda: False)
    monkeypatch.setattr(cpu_convolutions, "xla_knows_onednn_dots", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert cpu_convolutions.route_dots("xla") == "xla"
    assert "onednn" not in os.environ["XLA_FLAGS"]
    assert cpu_convolutions.route_dots("onednn") == "onednn"
    assert os.environ["XLA_FLAGS"].endswith(cpu_convolutions.ONEDNN_DOTS)
    assert cpu_convolutions.route_dots("onednn") == "flags"  # already there: not added twice
    assert os.environ["XLA_FLAGS"].count("xla_cpu_use_onednn") == 1
    with pytest.raises(ValueError, match="dots must go to one of"):
        cpu_convolutions.route_dots("mkl")


def test_the_layers_report_their_shape_classes():
    """``record_convolutions`` sees every k×k convolution the EDM layers trace, with its uses."""
    import haiku as hk
    import jax
    import jax.numpy as jnp

    from dew.networks import edm_layers

    def net(x):
        x = edm_layers.Conv2d(4, 3, name="a")(x)
        x = edm_layers.Conv2d(4, 3, name="b")(x)
        return edm_layers.Conv2d(2, 1, name="c")(x)  # 1×1: a matmul, no convolution

    with kernels.record_convolutions() as seen:
        jax.eval_shape(hk.transform(net).init, jax.random.PRNGKey(0), jnp.zeros((2, 5, 5, 3)))
    assert dict(seen) == {(5, 5, 3, 4, 3, 1): 1, (5, 5, 4, 4, 3, 1): 1}


def test_a_cache_of_earlier_versions_convolution_parts_is_read_without_complaint(tmp_path):
    """Files written when convolutions were timed hold ``decisions`` and ``shapes`` too: left
    unread, nothing said, the dots parts kept."""
    path = tmp_path / "kernel_choice.json"
    path.write_text(json.dumps({"decisions": {"k": {"times": {}}}, "shapes": {"s": []}, "dot_shapes": {}}))
    lines: list[str] = []
    assert kernel_cache.read_cache(str(path), lines.append) == {"dot_decisions": {}, "dot_shapes": {}}
    assert lines == []
