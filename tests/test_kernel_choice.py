"""The kernel choice (``dew.runtime.cpu.choice``): a forced setting wins (and ``XLA_FLAGS`` over
it), a resumed run keeps what it recorded (per-class gradient forms included, handed to the
layers; oneDNN's dots a run once recorded said in one line and not followed), the CPU-flag rule
decides otherwise and says why, an accelerator decides nothing, and ``dew.runtime.start``
applies the decision and records it, and never hands a transformer's dots to oneDNN."""

from __future__ import annotations

import json
import os

import pytest

from dew import kernels
from dew.runtime import compilation_cache
from dew.runtime.cpu import choice as kernel_choice
from dew.runtime.cpu import flags as cpu_convolutions
from dew.runtime.cpu.choice import Decision, choose

CPU = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
BIG, SMALL = [32, 32, 64, 64, 3, 1], [8, 8, 32, 32, 3, 1]


def choose_with(library="auto", gradient="auto", **kw):
    return choose(library, gradient, **{"environ": CPU, **kw})


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
    assert ruled.library == "ynnpack" and ruled.how == "CPU-flag rule"
    assert ruled.line().endswith("(CPU-flag rule)")
    machine.setattr(cpu_convolutions, "eigen_measured_faster", lambda features=None: True)
    assert choose_with().library == "eigen"
    half = choose_with("auto", "per_tap")
    assert half.library == "eigen" and half.how.startswith("weight gradient forced by config")
    # No XLA_FLAGS at all (a newcomer's environment) is no error.
    assert choose("auto", "auto", environ={}).per_tap is None


def test_a_resumed_run_keeps_its_recorded_choice_forms_included(machine):
    forms = frozenset({(tuple(BIG), "im2col", "per_tap"), (tuple(SMALL), "xla", "im2col")})
    recorded = Decision("eigen", frozenset({tuple(BIG)}), "measured", None, forms).record()
    resumed = choose_with(recorded=json.loads(json.dumps(recorded)), recorded_in="/w/run.json")
    assert (resumed.library, resumed.per_tap, resumed.forms) == ("eigen", frozenset({tuple(BIG)}), forms)
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


@pytest.mark.parametrize(
    "record",
    [
        ["ynnpack"],
        {"library": "mkl"},
        {"library": "eigen", "per_tap": [[32, 32, 64]]},
        {"library": "eigen", "per_tap_from": True},
        {"library": "eigen", "forms": [[*BIG, ["xla"], "xla"]]},
        {"library": "eigen", "forms": [[*BIG, "xla", "winograd"]]},
    ],
    ids=["not-an-object", "library", "per_tap", "per_tap_from", "form-not-a-string", "unknown-form"],
)
def test_a_malformed_record_is_one_error_naming_the_file(machine, record):
    """run.json is untrusted: a ``kernels`` record that ``Decision.record`` could not have written
    is a ValueError naming the file (``dew.launch`` makes it one line and exit 2)."""
    with pytest.raises(ValueError, match=r"^/w/run\.json is malformed: 'kernels"):
        choose_with(recorded=record, recorded_in="/w/run.json")


def test_an_accelerator_decides_nothing(machine):
    decision = choose_with(environ={"JAX_PLATFORMS": "cuda"})
    assert decision.library == "ynnpack" and "not the CPU" in decision.how
    assert not kernel_choice.cpu_backend_expected({"JAX_PLATFORMS": "tpu,cpu"})
    assert kernel_choice.cpu_backend_expected({"JAX_PLATFORMS": "cpu"})


def run_config(model: dict):
    """A resolved run config's sections that ``dew.runtime.start`` reads, for ``model``."""
    from ml_collections import ConfigDict

    runtime = {
        "host_devices": 0,
        "cpu_convolutions": "auto",
        "cpu_weight_gradient": "auto",
        "compilation_cache": "off",
        "coordinator_timeout": 300,
        "heartbeat_timeout": 100,
    }
    return ConfigDict(
        {
            "runtime": runtime,
            "model": model,
            "dataset": {"name": "digits", "batch_size": 64},
            "train": {"accumulation": 1},
        }
    )


@pytest.fixture
def unstarted(machine, tmp_path):
    """``dew.runtime.start`` as before JAX starts, on a 2-device CPU whose rule picks Eigen, the
    machine's cache in ``tmp_path / "machine"``; the kernel choice restored afterwards."""
    from dew.runtime import backend
    from dew.runtime.cpu import devices, setup

    machine.setattr(devices, "backend_started", lambda: False)
    machine.setattr(backend, "backend_started", lambda: False)
    machine.setattr(cpu_convolutions, "_backend_started", lambda: False)
    machine.setattr(cpu_convolutions, "eigen_measured_faster", lambda features=None: True)
    machine.setenv("XLA_FLAGS", CPU["XLA_FLAGS"])
    machine.setenv("JAX_PLATFORMS", "cpu")
    machine.setenv(compilation_cache.MACHINE_VARIABLE, str(tmp_path / "machine"))
    previous, applied = kernels.current(), setup._applied
    yield machine
    kernels.set_choice(previous)
    machine.setattr(setup, "_applied", applied)


def test_start_applies_records_and_resumes_a_u_net(unstarted, tmp_path):
    """``dew.runtime.start`` with a SongUNet run config: the rule's choice reaches the layers and
    run.json's record, and no kernel cache is written; a record resumes."""
    from dew.runtime import platform

    config = run_config({"name": "songunet", "model_channels": 32})
    first = platform.start(config, str(tmp_path))
    assert first.decision is not None
    assert first.convolutions == "eigen" and first.decision.library == "eigen"
    assert os.environ["XLA_FLAGS"].endswith(cpu_convolutions.EIGEN_ROUTE)
    assert any(line.startswith("kernel choice: convolutions on eigen") for line in first.lines())
    record = first.kernels_record()
    assert record is not None and record["library"] == "eigen" and record["cpu"].startswith("Test CPU")
    assert "dots" not in record
    assert not (tmp_path / "cache").exists() and not (tmp_path / "machine").exists()
    unstarted.setenv("XLA_FLAGS", CPU["XLA_FLAGS"])
    resumed = platform.start(config, str(tmp_path), recorded={"library": "ynnpack", "per_tap": [BIG]})
    assert resumed.decision is not None
    assert resumed.convolutions == "ynnpack" and "recorded" in resumed.decision.how
    assert kernels.current().per_tap_convolutions == frozenset({tuple(BIG)})


#: The ``kernels`` a transformer's run.json recorded where oneDNN's dots were measured faster
#: (written by an earlier version on the AMD EPYC whose run then aborted compiling its step).
ONEDNN_RECORD = {
    "cpu": "AMD EPYC (family 25, model 17, 2 cores, flags 08328ec5)",
    "dots": "onednn",
    "forms": None,
    "how": "CPU-flag rule: convolutions are not timed; dots cached for this machine in "
    "/root/.cache/dew/kernel_choice.json: the step's matrix products xla 99 ms, onednn 67 ms",
    "jaxlib": "0.10.2",
    "library": "ynnpack",
    "per_tap": None,
    "per_tap_from": None,
}


def test_the_cpu_platform_never_hands_dots_to_onednn(unstarted, tmp_path, capsys):
    """A transformer's run, fresh or resumed from a run.json that recorded oneDNN's dots, beside
    the kernel caches an earlier version wrote (a oneDNN decision for this machine): XLA_FLAGS
    after ``start`` name no oneDNN flag (``--xla_cpu_use_onednn``, its fusion type), the resumed
    run says so in one line, and neither cache is read or written."""
    from dew.runtime import platform

    old_cache = json.dumps({"dot_decisions": {"k": {"times": {"onednn": {}}}}, "dot_shapes": {}})
    for folder in (tmp_path / "machine", tmp_path / "cache"):
        folder.mkdir()
        (folder / "kernel_choice.json").write_text(old_cache)
    config = run_config({"name": "SiT-S/2"})
    fresh = platform.start(config, str(tmp_path))
    assert "onednn" not in os.environ["XLA_FLAGS"].lower()
    assert fresh.decision is not None and "onednn" not in fresh.decision.line().lower()
    assert "onednn" not in capsys.readouterr().out.lower()
    unstarted.setenv("XLA_FLAGS", CPU["XLA_FLAGS"])
    resumed = platform.start(config, str(tmp_path), recorded=ONEDNN_RECORD, recorded_in="/w/run.json")
    assert "onednn" not in os.environ["XLA_FLAGS"].lower()
    said = [line for line in capsys.readouterr().out.splitlines() if "oneDNN" in line]
    assert said == ["dew: " + kernel_choice.ONEDNN_RECORDED.format(where="/w/run.json")]
    assert resumed.decision is not None and resumed.decision.library == "ynnpack"
    assert "dots" not in (resumed.kernels_record() or {})
    for folder in (tmp_path / "machine", tmp_path / "cache"):
        assert (folder / "kernel_choice.json").read_text() == old_cache


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
