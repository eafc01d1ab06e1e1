"""The measured kernel choice (``dew.runtime.kernel_choice``): the fastest candidate is kept, the
decision is cached and reused (a second start measures nothing), the cache key follows the CPU,
jaxlib and the shapes, a forced setting overrides the cache, a resumed run keeps what it recorded,
an accelerator measures nothing; and one real measurement child on a tiny convolution."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from helpers_common import ROOT

from dew import kernels
from dew.runtime import cpu_convolutions, host_devices, kernel_cache, kernel_choice
from dew.runtime.kernel_choice import Decision, ShapeSource, choose

CPU = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
BIG, SMALL = [32, 32, 64, 64, 3, 1], [8, 8, 32, 32, 3, 1]
SHAPES = {"batch": 64, "convolutions": [[*BIG, 4], [*SMALL, 10]]}
# Seconds per call of forward + gradients, by library (what the child reads off XLA_FLAGS).
TIMES = {
    "ynnpack": {
        json.dumps(BIG): {"xla": 0.90, "per_tap": 0.20},
        json.dumps(SMALL): {"xla": 0.010, "per_tap": 0.012},
    },
    "eigen": {
        json.dumps(BIG): {"xla": 0.10, "per_tap": 0.16},
        json.dumps(SMALL): {"xla": 0.004, "per_tap": 0.006},
    },
}
SOURCE = ShapeSource("tests.nowhere:shapes", {}, {"model": "songunet", "batch": 64})


class Children:
    """A stand-in for the measurement children: answers from SHAPES and TIMES, counts the calls.

    A form a route's row lacks costs 10× XLA's; where the row has no XLA time either (a route
    TIMES does not name: ``ynnpack+onednn``, ...) it compiles to the same digest as its base
    library's (oneDNN took none of its dots)."""

    def __init__(self, times=TIMES, shapes=SHAPES, failing=None):
        self.calls: list[tuple[str, str]] = []
        self.times, self.shapes, self.failing = times, shapes, failing

    def trace(self, source):
        self.calls.append(("shapes", "ynnpack"))
        return self.shapes

    def __call__(self, mode, payload, environment):
        flags = environment.get("XLA_FLAGS", "")
        route = cpu_convolutions.library_in_flags(flags) or "ynnpack"
        route += "+onednn" if cpu_convolutions.ONEDNN_DOTS in flags else ""
        self.calls.append((mode, route))
        if mode == "shapes":  # no child traces shapes now; kept to run these tests on older code
            return self.shapes
        assert payload["batch"] == self.shapes["batch"]
        forms = payload.get("forms", list(kernel_cache.FORMS))
        times, programs, unchanged = {}, {}, []
        for c in map(json.dumps, payload["convolutions"]):
            rows = self.times.get(route, {})
            programs[c] = {f: f"{route}:{f}" for f in forms}
            for f in forms:
                if c in rows and f in rows[c]:
                    times.setdefault(c, {})[f] = rows[c][f]
                elif "xla" in rows.get(c, {}):
                    times.setdefault(c, {})[f] = 10 * rows[c]["xla"]
                else:
                    programs[c][f] = payload["same_as"][c][f]
                    unchanged.append([c, f])
        failed = []
        if self.failing is not None and route.endswith("+onednn"):
            if self.failing == "child":
                raise RuntimeError("the kernel measurement child (time) failed: partition compile failed")
            failed = [[c, self.failing, "XlaRuntimeError: partition compile failed"] for c in times]
            for c in times:
                times[c].pop(self.failing, None)
        return {"times": times, "programs": programs, "unchanged": unchanged, "failed": failed}


def choose_with(cache, children, library="auto", gradient="auto", *, tracer=None, **kw):
    """``choose`` as these tests call it: ``children`` measure (and trace, unless ``tracer``), the
    run's ``SOURCE`` on 2 CPU devices unless ``shapes``/``devices``/``environ`` say otherwise;
    ``cache`` None: no cache file."""
    settings = {"shapes": SOURCE, "devices": 2, "environ": CPU, **kw}
    return choose(
        library,
        gradient,
        cache=None if cache is None else str(cache),
        runner=children,
        tracer=children.trace if tracer is None else tracer,
        **settings,
    )


def test_the_fastest_is_kept_and_handed_to_the_layers(machine, tmp_path):
    children = Children()
    decision = choose_with(tmp_path / "k.json", children)
    # eigen: 4·0.10 + 10·0.004 = 0.44 s against ynnpack's 4·0.20 + 10·0.010 = 0.90 s; under eigen
    # XLA's gradient is the faster for both classes, so none is per-tap.
    assert decision.library == "eigen" and decision.per_tap == frozenset()
    assert "measured" in decision.how and "eigen 440 ms" in decision.how and "ynnpack 900 ms" in decision.how
    # oneDNN took none of the programs' dots (this stand-in's CPU): said, and the other library's
    # oneDNN route not started.
    assert children.calls == [
        ("shapes", "ynnpack"),
        ("time", "ynnpack"),
        ("time", "eigen"),
        ("time", "ynnpack+onednn"),
    ]
    assert "ynnpack+onednn: not used by XLA on this CPU" in decision.how and decision.dots == "xla"
    assert "eigen+onednn: not used by XLA on this CPU" in decision.how
    # With YNNPACK faster overall, its per-tap class is kept where it won (BIG: 0.20 < 0.90).
    slow_eigen = {
        "ynnpack": TIMES["ynnpack"],
        "eigen": {c: {g: 10 * t for g, t in r.items()} for c, r in TIMES["eigen"].items()},
    }
    decision = choose_with(tmp_path / "other.json", Children(slow_eigen))
    assert decision.library == "ynnpack" and decision.per_tap == frozenset({tuple(BIG)})
    previous = kernels.current()
    try:
        kernels.set_choice(decision.kernel_choice())
        assert kernels.per_tap_weight_gradient(32 * 32, tuple(BIG))
        assert not kernels.per_tap_weight_gradient(8 * 8, tuple(SMALL))
        assert not kernels.per_tap_weight_gradient(32 * 32, (32, 32, 64, 32, 3, 1))  # not measured: XLA's
    finally:
        kernels.set_choice(previous)


def test_within_the_margin_the_default_stays():
    counts = {json.dumps(SMALL): 1}
    near = {
        "ynnpack": {json.dumps(SMALL): {"xla": 1.0, "per_tap": 0.99}},
        "eigen": {json.dumps(SMALL): {"xla": 0.99, "per_tap": 1.0}},
    }
    assert kernel_choice.decide(near, counts, ("ynnpack", "eigen"), ("xla", "per_tap"))[:2] == (
        "ynnpack",
        frozenset(),
    )


def test_the_decision_is_cached_and_a_second_start_measures_nothing(machine, tmp_path):
    cache = tmp_path / "cache" / "kernel_choice.json"
    first = choose_with(cache, Children())
    children = Children()
    second = choose_with(cache, children)
    assert children.calls == []
    assert (second.library, second.per_tap) == (first.library, first.per_tap)
    assert second.how.startswith(f"cached from {cache}")
    stored = json.loads(cache.read_text())
    (entry,) = stored["decisions"].values()
    assert entry["cpu"].startswith("Test CPU") and entry["jaxlib"] == "0.10.2" and entry["devices"] == 2
    assert entry["counts"] == {json.dumps(BIG): 4, json.dumps(SMALL): 10}


@pytest.mark.parametrize("change", ["cpu", "jaxlib", "shapes", "devices"])
def test_the_cache_key_follows_cpu_jaxlib_and_shapes(machine, tmp_path, change):
    cache = tmp_path / "k.json"
    choose_with(cache, Children())
    children, devices, source = Children(), 2, SOURCE
    if change == "cpu":
        machine.setattr(kernel_choice, "cpu_model", lambda: "Other CPU (family 2, model 9, 2 cores)")
    elif change == "jaxlib":
        machine.setattr(kernel_choice, "jaxlib_version", lambda: "0.10.3")
    elif change == "shapes":  # another batch: the network traces to other shapes
        source = ShapeSource(SOURCE.function, {}, {"model": "songunet", "batch": 32})
        children = Children(shapes={**SHAPES, "batch": 32})
    else:
        devices = 1
    choose_with(cache, children, shapes=source, devices=devices)
    measured = [mode for mode, _ in children.calls]
    # A new CPU, jaxlib, device count or shape source measures again, and traces the run's shapes
    # first every time it measures: the run's own checks come before any measurement.
    assert measured.count("time") == 3, children.calls
    assert measured[0] == "shapes" and measured.count("shapes") == 1
    assert len(json.loads(cache.read_text())["decisions"]) == 2
    key = kernel_choice.decision_key
    assert key("a", "1", 2, 64, [BIG]) != key("b", "1", 2, 64, [BIG]) != key("a", "2", 2, 64, [BIG])
    assert key("a", "1", 2, 64, [BIG]) != key("a", "1", 2, 64, [SMALL]) != key("a", "1", 2, 32, [SMALL])


def test_a_forced_choice_overrides_the_cache(machine, tmp_path):
    cache = tmp_path / "k.json"
    assert choose_with(cache, Children()).library == "eigen"
    children = Children()
    forced = choose_with(cache, children, "ynnpack", "xla")
    assert (forced.library, forced.per_tap, forced.how) == ("ynnpack", frozenset(), "forced by config")
    # The library forced, the gradient measured: YNNPACK's cached times decide the classes.
    half = choose_with(cache, children, "ynnpack", "auto")
    assert (half.library, half.per_tap) == ("ynnpack", frozenset({tuple(BIG)})) and "cached" in half.how
    every = choose_with(cache, children, "auto", "per_tap")
    assert every.library == "eigen" and every.kernel_choice().per_tap_weight_gradient_from == 1
    assert children.calls == []
    # XLA_FLAGS naming the library wins over the config.
    flagged = {**CPU, "XLA_FLAGS": f"{CPU['XLA_FLAGS']} {cpu_convolutions.EIGEN_ROUTE}"}
    assert choose_with(None, children, "ynnpack", "xla", environ=flagged).library == "eigen"


def test_a_resumed_run_keeps_its_recorded_choice(machine, tmp_path):
    cache = tmp_path / "k.json"
    choose_with(cache, Children())  # the cache now says eigen, no per-tap class
    recorded = Decision("ynnpack", frozenset({tuple(SMALL)}), "measured").record()
    children = Children()
    resumed = choose_with(
        cache, children, recorded=json.loads(json.dumps(recorded)), recorded_in="/w/run.json"
    )
    assert (resumed.library, resumed.per_tap) == ("ynnpack", frozenset({tuple(SMALL)}))
    assert resumed.how == "recorded with the run's checkpoints in /w/run.json" and children.calls == []
    told = choose_with(cache, children, "eigen", "xla", recorded=recorded)
    assert (told.library, told.per_tap) == ("eigen", frozenset())  # told otherwise: the config wins


def test_an_accelerator_measures_nothing(machine, tmp_path):
    children = Children()
    decision = choose_with(tmp_path / "k.json", children, devices=1, environ={"JAX_PLATFORMS": "cuda"})
    assert children.calls == [] and decision.library == "ynnpack" and "not the CPU" in decision.how
    assert not (tmp_path / "k.json").exists()
    assert not kernel_choice.cpu_backend_expected({"JAX_PLATFORMS": "tpu,cpu"})
    assert kernel_choice.cpu_backend_expected({"JAX_PLATFORMS": "cpu"})


def test_start_measures_once_records_and_resumes(machine, tmp_path):
    """``dew.runtime.start`` with a SongUNet run config: the choice is applied to the layers and
    ready for run.json; the second start in the workdir reads the cache; the record resumes."""
    from ml_collections import ConfigDict

    from dew.runtime import platform

    children = Children()
    machine.setattr(kernel_choice, "run_probe", children)
    machine.setattr(kernel_choice.ShapeSource, "trace", children.trace)
    machine.setattr(host_devices, "backend_started", lambda: False)
    machine.setattr(cpu_convolutions, "_backend_started", lambda: False)
    machine.setenv("XLA_FLAGS", CPU["XLA_FLAGS"])
    machine.setenv("JAX_PLATFORMS", "cpu")
    machine.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    machine.delenv(kernel_choice.BY_RULE_VARIABLE, raising=False)  # the suite's own setting
    machine.setenv(kernel_choice.MACHINE_CACHE_VARIABLE, str(tmp_path / "machine"))
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
    previous, applied = kernels.current(), kernel_choice._applied
    try:
        first = platform.start(config, str(tmp_path))
        assert first.convolutions == "eigen" and first.decision.library == "eigen"
        assert os.environ["XLA_FLAGS"].endswith(cpu_convolutions.EIGEN_ROUTE)
        assert kernels.current().per_tap_convolutions == frozenset()
        assert any(line.startswith("kernel choice: convolutions on eigen") for line in first.lines())
        record = kernel_choice.applied_record()
        assert (
            record["library"] == "eigen" and record["per_tap"] == [] and record["cpu"].startswith("Test CPU")
        )
        assert (tmp_path / "cache" / kernel_choice.CACHE_FILE).exists()
        assert (tmp_path / "machine" / kernel_choice.CACHE_FILE).exists()
        calls = len(children.calls)
        machine.setenv("XLA_FLAGS", CPU["XLA_FLAGS"])
        second = platform.start(config, str(tmp_path))
        assert len(children.calls) == calls and second.decision.how.startswith("cached from")
        machine.setenv("XLA_FLAGS", CPU["XLA_FLAGS"])
        resumed = platform.start(config, str(tmp_path), recorded={"library": "ynnpack", "per_tap": [BIG]})
        assert resumed.convolutions == "ynnpack" and "recorded" in resumed.decision.how
        assert kernels.current().per_tap_convolutions == frozenset({tuple(BIG)})
        assert len(children.calls) == calls
    finally:
        kernels.set_choice(previous)
        kernel_choice.set_applied(applied)


def test_a_new_workdir_on_a_measured_machine_measures_nothing(machine, tmp_path):
    """The machine's copy (``DEW_CACHE_DIR``) serves every workdir; with it off, each measures."""
    shared = tmp_path / "machine" / kernel_choice.CACHE_FILE
    first = choose_with(tmp_path / "run1" / "k.json", Children(), machine_cache=str(shared))
    assert first.how.startswith("measured") and shared.exists()
    children = Children()
    second = choose_with(tmp_path / "run2" / "k.json", children, machine_cache=str(shared))
    assert children.calls == []
    assert (second.library, second.per_tap) == (first.library, first.per_tap)
    assert second.how.startswith(f"cached for this machine in {shared}")
    assert (tmp_path / "run2" / "k.json").exists()  # the workdir keeps its own copy
    children = Children()
    alone = choose_with(tmp_path / "run3" / "k.json", children, machine_cache=None)
    assert ("time", first.library) in children.calls and alone.how.startswith("measured")
    assert kernel_choice.machine_cache_path({"DEW_CACHE_DIR": "off"}) is None
    assert kernel_choice.machine_cache_path({"DEW_CACHE_DIR": "/x"}) == f"/x/{kernel_choice.CACHE_FILE}"
    assert kernel_choice.machine_cache_path({"XDG_CACHE_HOME": "/c"}) == f"/c/dew/{kernel_choice.CACHE_FILE}"


def test_asked_not_to_measure_the_cpu_flag_rule_is_taken_and_named(machine, tmp_path):
    """``DEW_KERNELS_BY_RULE=1`` (this suite sets it for every run it starts): no child runs, the
    rule decides, and the line says why; a forced setting still wins."""
    children = Children()
    environ = {**CPU, kernel_choice.BY_RULE_VARIABLE: "1"}
    cache = tmp_path / "cache.json"
    ruled = choose_with(cache, children, environ=environ)
    assert children.calls == [] and not cache.exists()
    assert ruled.how == f"CPU-flag rule: {kernel_choice.BY_RULE_VARIABLE}=1 asks for no measurement"
    forced = choose_with(None, children, "eigen", "xla", environ=environ)
    assert (forced.library, forced.how) == ("eigen", "forced by config") and children.calls == []


def test_one_real_measurement_child(tmp_path):
    """A real child: both weight gradients of a tiny convolution are timed, on 2 CPU devices."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    answer = kernel_choice.run_probe("time", {"batch": 4, "convolutions": [[6, 6, 3, 5, 3, 1]]}, env)
    (row,) = answer["times"].values()
    assert set(row) == set(kernel_cache.FORMS) and all(0 < t < 10 for t in row.values())
    assert list(answer["times"]) == [json.dumps([6, 6, 3, 5, 3, 1])] and answer["unchanged"] == []


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


def _damaged(text):
    """Each way a cache file can be valid JSON of another shape, keyed as ``choose`` keys it."""

    def edit(data):
        decisions, shapes = data["decisions"], data["shapes"]
        (key,), (shape_key,) = list(decisions), list(shapes)
        if text == "lists":
            return {"decisions": [], "shapes": []}
        if text == "no-times":
            del decisions[key]["times"]
        elif text == "string-decision":
            decisions[key] = "eigen"
        elif text == "no-convolutions":
            del shapes[shape_key]["convolutions"]
            del decisions[key]  # so the shapes are needed
        elif text == "missing-class":
            del decisions[key]["times"]["eigen"][json.dumps(SMALL)]
        elif text == "array":
            return [1, 2]
        return data

    return edit


@pytest.mark.parametrize(
    "damage", ["lists", "no-times", "string-decision", "no-convolutions", "missing-class", "array"]
)
def test_a_malformed_cache_is_a_hint_said_measured_again_and_replaced(machine, tmp_path, damage):
    """A cache of the right JSON but the wrong shape: one line naming the file, measured again,
    the entry replaced (the next start reads it), never an error."""
    cache = tmp_path / "k.json"
    first = choose_with(cache, Children())
    cache.write_text(json.dumps(_damaged(damage)(json.loads(cache.read_text()))))
    lines, children = [], Children()
    again = choose_with(cache, children, log=lines.append)
    assert ("time", "ynnpack") in children.calls and again.how.startswith("measured")
    assert (again.library, again.per_tap) == (first.library, first.per_tap)
    named = [line for line in lines if str(cache) in line]
    assert len(named) == 1, lines
    children = Children()
    assert choose_with(cache, children).how.startswith("cached from") and children.calls == []
    assert [p.name for p in tmp_path.iterdir()] == ["k.json"]


def test_a_directory_or_an_unwritable_cache_measures_says_so_once_and_leaves_nothing(machine, tmp_path):
    """A directory in the cache file's place (the machine's copy, the workdir's): measured, said
    once per file, no temporary file left; a cache directory that cannot be written at all (the
    run's workdir cannot be either) measures nothing."""
    machine.setattr(kernel_cache, "_unwritable", set(), raising=False)
    cache, shared = tmp_path / "run" / "k.json", tmp_path / "machine" / kernel_choice.CACHE_FILE
    cache.mkdir(parents=True)
    shared.mkdir(parents=True)
    for _ in range(2):
        lines = []
        decided = choose_with(cache, Children(), machine_cache=str(shared), log=lines.append)
        assert decided.how.startswith("measured")
        assert [p.name for p in cache.parent.iterdir()] == ["k.json"]
        assert [p.name for p in shared.parent.iterdir()] == [kernel_choice.CACHE_FILE]
    said = [line for line in lines if "cannot write" in line]
    assert said == [], lines  # said by the first start only
    children = Children()  # /proc takes no new directory, whoever asks (root too)
    unmeasured = choose_with("/proc/dew-no-such-run/cache/k.json", children)
    assert ("time", "ynnpack") not in children.calls and "cannot be written" in unmeasured.how


def test_an_unwritable_cache_is_said_once(machine, tmp_path):
    machine.setattr(kernel_cache, "_unwritable", set(), raising=False)
    shared = tmp_path / "machine" / kernel_choice.CACHE_FILE
    shared.mkdir(parents=True)
    lines = []
    choose_with(tmp_path / "k.json", Children(), machine_cache=str(shared), log=lines.append)
    said = [line for line in lines if "cannot write" in line]
    assert len(said) == 1 and str(shared) in said[0], lines


def test_no_xla_flags_in_the_environment_is_not_an_error(machine):
    """The CPU-flag rule without ``XLA_FLAGS`` (a newcomer's environment): no KeyError."""
    for shapes in (None, SOURCE):
        environ = {"JAX_PLATFORMS": "cpu", kernel_choice.BY_RULE_VARIABLE: "1"}
        decision = choose_with(None, Children(), shapes=shapes, devices=1, environ=environ)
        assert decision.how.startswith("CPU-flag rule")
    assert choose("auto", "auto", shapes=None, devices=1, cache=None, environ={}).per_tap is None


def test_a_config_the_run_refuses_is_not_measured(machine, tmp_path):
    """The run's shapes are traced (with its checks) before anything is measured: a trace that
    raises leaves the rule's decision, and the run's own check reports the problem."""

    def refusing(source):
        raise ValueError("config.dataset.batch_size=4096 is invalid")

    children = Children()
    decision = choose_with(tmp_path / "k.json", children, tracer=refusing)
    assert children.calls == [] and not (tmp_path / "k.json").exists()
    assert "did not trace" in decision.how


def test_the_shapes_are_traced_in_this_process_with_its_registrations():
    """``trainer_convolutions`` sees a data set registered in this process and leaves JAX's
    backend as it was; its classes are the EDM layers' (a one-level U-Net of 8 channels)."""
    from ml_collections import ConfigDict

    from dew import registry
    from dew.data.sources.digits import digits
    from dew.runtime import platform
    from dew.training.trainer_config import resolve_config

    name = "digits_registered_here"
    if name not in registry.datasets:
        registry.datasets.register(name, digits)
    config = resolve_config(
        ConfigDict(
            {
                "dataset": {"name": name, "batch_size": 16},
                "model": {
                    "name": "songunet",
                    "model_channels": 8,
                    "num_blocks": 1,
                    "channel_mult": (1,),
                    "attn_resolutions": (),
                },
            }
        )
    )
    traced = kernel_choice.ShapeSource.trace(platform.run_shapes(config, 2))
    assert traced["batch"] == 16
    assert [8, 8, 8, 8, 3, 1] in [row[:6] for row in traced["convolutions"]]


ONEDNN_TIMES = {
    **TIMES,
    # oneDNN's dots make the per-tap form of BIG faster under YNNPACK's convolutions, and every dot
    # form slower under Eigen's; the XLA programs (no dots) compile to the same digests as their
    # library's alone, so they are not timed again.
    "ynnpack+onednn": {
        json.dumps(BIG): {
            "per_tap": 0.09,
            "weight_im2col": 0.30,
            "input_per_tap": 0.99,
            "input_im2col": 0.95,
        },
        json.dumps(SMALL): {
            "per_tap": 0.012,
            "weight_im2col": 0.02,
            "input_per_tap": 0.02,
            "input_im2col": 0.02,
        },
    },
    "eigen+onednn": {
        json.dumps(BIG): {"per_tap": 0.5, "weight_im2col": 0.5, "input_per_tap": 0.5, "input_im2col": 0.5},
        json.dumps(SMALL): {
            "per_tap": 0.05,
            "weight_im2col": 0.05,
            "input_per_tap": 0.05,
            "input_im2col": 0.05,
        },
    },
}


def test_onednn_dots_are_a_measured_route_and_what_they_leave_unchanged_is_not_timed(machine, tmp_path):
    """A route whose programs oneDNN changes is timed (only those programs: the rest take the base
    library's times), wins where it is fastest, is cached, and reaches the run as ``dots``."""
    cache = tmp_path / "k.json"
    children = Children(ONEDNN_TIMES)
    decision = choose_with(cache, children)
    # ynnpack+onednn: BIG per-tap 0.09 × 4 + SMALL XLA's (YNNPACK's time) 0.010 × 10 = 0.46 s
    # against eigen's 0.44 s: eigen stays.
    assert decision.library == "eigen" and decision.dots == "xla"
    assert "ynnpack+onednn 460 ms" in decision.how and "not used" not in decision.how
    assert ("time", "eigen+onednn") in children.calls  # measured too: its dots are oneDNN's
    stored = json.loads(cache.read_text())
    (entry,) = stored["decisions"].values()
    assert (
        entry["times"]["ynnpack+onednn"][json.dumps(BIG)]["xla"] == TIMES["ynnpack"][json.dumps(BIG)]["xla"]
    )
    # Faster still: oneDNN's route wins, with its per-class forms.
    faster = {
        **ONEDNN_TIMES,
        "ynnpack+onednn": {c: dict(r) for c, r in ONEDNN_TIMES["ynnpack+onednn"].items()},
    }
    faster["ynnpack+onednn"][json.dumps(BIG)]["per_tap"] = 0.05
    decision = choose_with(tmp_path / "other.json", Children(faster))
    assert (decision.library, decision.dots) == ("ynnpack", "onednn")
    assert decision.per_tap == frozenset({tuple(BIG)})
    assert decision.line().startswith(
        "convolutions on ynnpack, weight gradients per-tap for 1 shape class(es)"
    )
    assert ", dots on oneDNN (" in decision.line()
    record = json.loads(json.dumps(decision.record()))
    assert Decision.from_record(record, "recorded") == dataclasses.replace(decision, how="recorded")
    children = Children(faster)
    again = choose_with(tmp_path / "other.json", children)
    assert children.calls == [] and (again.library, again.dots, again.forms) == (
        "ynnpack",
        "onednn",
        decision.forms,
    )


def test_the_input_and_weight_gradient_forms_are_chosen_per_class():
    """Each gradient's form is the fastest of the programs varying only it; the pair is costed as
    the sum of the two changes from XLA's, and handed to the layers class by class."""
    counts = {json.dumps(BIG): 2, json.dumps(SMALL): 3}
    row_big = {"xla": 1.0, "per_tap": 0.7, "weight_im2col": 0.9, "input_per_tap": 1.2, "input_im2col": 0.8}
    row_small = {
        "xla": 0.1,
        "per_tap": 0.2,
        "weight_im2col": 0.05,
        "input_per_tap": 0.1,
        "input_im2col": 0.099,
    }
    times = {"ynnpack": {json.dumps(BIG): row_big, json.dumps(SMALL): row_small}}
    route, per_tap, totals, forms = kernel_choice.decide(
        times, counts, ("ynnpack",), kernel_choice.WEIGHT_FORM_NAMES
    )
    assert route == "ynnpack" and per_tap == frozenset({tuple(BIG)})
    # BIG: per-tap weight (−0.3) and im2col input (−0.2): 0.5; SMALL: im2col weight (−0.05), the
    # input's 1 % gain is inside the margin: XLA's. 2 · 0.5 + 3 · 0.05 = 1.15 s.
    assert forms == frozenset({(tuple(BIG), "im2col", "per_tap"), (tuple(SMALL), "xla", "im2col")})
    assert totals["ynnpack"] == pytest.approx(1.15)
    # The weight gradient forced to XLA's: only the input's form is chosen.
    _, per_tap, _, forms = kernel_choice.decide(times, counts, ("ynnpack",), ("xla",))
    assert per_tap == frozenset() and (tuple(SMALL), "xla", "xla") in forms
    decision = Decision(
        "ynnpack",
        frozenset({tuple(BIG)}),
        "measured",
        None,
        frozenset({(tuple(BIG), "im2col", "per_tap"), (tuple(SMALL), "xla", "im2col")}),
    )
    assert "weight gradients per-tap for 1, im2col for 1 shape class(es)" in decision.line()
    assert "input gradients im2col for 1 shape class(es)" in decision.line()
    previous = kernels.current()
    try:
        kernels.set_choice(decision.kernel_choice())
        assert kernels.convolution_forms(32 * 32, tuple(BIG)) == ("im2col", "per_tap")
        assert kernels.convolution_forms(8 * 8, tuple(SMALL)) == ("xla", "im2col")
    finally:
        kernels.set_choice(previous)


def test_a_cache_from_before_the_new_forms_is_measured_again_without_complaint(machine, tmp_path):
    """A decision timed with only XLA's and the per-tap gradient (an earlier dew's cache) is
    well formed but lacks the forms now measured: measured again, silently, and replaced."""
    cache = tmp_path / "k.json"
    choose_with(cache, Children())
    data = json.loads(cache.read_text())
    for entry in data["decisions"].values():
        entry["times"] = {
            lib: {c: {"xla": r["xla"], "per_tap": r["per_tap"]} for c, r in rows.items()}
            for lib, rows in entry["times"].items()
        }
        del entry["unused"], entry["programs"]
    cache.write_text(json.dumps(data))
    lines, children = [], Children()
    again = choose_with(cache, children, log=lines.append)
    assert again.how.startswith("measured") and ("time", "ynnpack") in children.calls
    assert not [line for line in lines if "malformed" in line or "unusable" in line], lines


def test_where_xla_flags_or_jaxlib_leave_no_onednn_route_it_is_said(machine, tmp_path):
    children = Children()
    flagged = {**CPU, "XLA_FLAGS": f"{CPU['XLA_FLAGS']} --xla_cpu_use_onednn=false"}
    decision = choose(
        "auto", "auto", shapes=SOURCE, devices=2, cache=None, runner=children, tracer=children.trace,
        environ=flagged,
    )  # fmt: skip
    assert "dots: as XLA_FLAGS says" in decision.how and not any("+onednn" in r for _, r in children.calls)
    machine.setattr(cpu_convolutions, "xla_knows_onednn_dots", lambda: False)
    decision = choose_with(tmp_path / "k.json", Children())
    assert "onednn: not in this jaxlib's XLA" in decision.how


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


def test_a_real_onednn_child_reports_what_it_left_unchanged(tmp_path):
    """Two real children, YNNPACK's and the same with oneDNN's dots: XLA's own program (a
    convolution, no dot) compiles the same under both and is not timed again; whichever dot forms
    oneDNN took on this CPU are timed, the rest reported unchanged (no CPU assumed)."""
    if not cpu_convolutions.xla_knows_onednn_dots():
        pytest.skip("this jaxlib's XLA has no oneDNN flags")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    payload = {"batch": 2, "convolutions": [[6, 6, 3, 5, 3, 1]], "forms": ["xla", "weight_im2col"]}
    base = kernel_choice.run_probe("time", payload, env)
    onednn = kernel_choice.run_probe(
        "time",
        {**payload, "same_as": base["programs"]},
        kernel_choice.library_environment("ynnpack+onednn", env),
    )
    name = json.dumps([6, 6, 3, 5, 3, 1])
    assert [name, "xla"] in onednn["unchanged"]
    timed = set(onednn["times"].get(name, {}))
    assert timed | {f for c, f in onednn["unchanged"]} == {"xla", "weight_im2col"} and "xla" not in timed


@pytest.mark.parametrize("failing", ["per_tap", "child"])
def test_a_route_xla_cannot_compile_is_no_candidate_and_the_rest_stand(machine, tmp_path, failing):
    """oneDNN's route refusing a program (XLA's 'partition compile failed') or its child failing:
    that route is said and dropped (a run on it could fail the same way); the libraries' times
    still decide, and the other oneDNN route is not started."""
    children = Children(ONEDNN_TIMES, failing=failing)
    decision = choose_with(tmp_path / "k.json", children)
    assert decision.how.startswith("measured") and (decision.library, decision.dots) == ("eigen", "xla")
    said = "its measurement child failed"
    if failing == "per_tap":
        said = "XLA could not compile 2 of its programs"
    assert f"ynnpack+onednn: {said}" in decision.how and f"eigen+onednn: {said}" in decision.how
    assert ("time", "eigen+onednn") not in children.calls


def test_two_gains_larger_than_the_program_never_cost_it_below_nothing():
    """Timed apart, the per-tap weight gradient and the im2col input gradient each saved more than
    half of XLA's program: their sum once costed the step at a negative time ("ynnpack -6 ms").
    The faster of the two measured programs stands for the pair instead."""
    counts = {json.dumps(BIG): 2}
    row = {"xla": 1.0, "per_tap": 0.3, "weight_im2col": 0.9, "input_per_tap": 1.2, "input_im2col": 0.4}
    times = {"ynnpack": {json.dumps(BIG): row}, "eigen": {json.dumps(BIG): dict(row, xla=1.0, per_tap=0.6)}}
    route, _, totals, forms = kernel_choice.decide(
        times, counts, ("ynnpack", "eigen"), kernel_choice.WEIGHT_FORM_NAMES
    )
    assert totals["ynnpack"] == pytest.approx(2 * 0.3)  # not 2 · (0.3 + 0.4 − 1.0) = −0.6
    assert totals["eigen"] == pytest.approx(2 * 0.4)
    assert route == "ynnpack" and forms == frozenset({(tuple(BIG), "im2col", "per_tap")})
    assert all(total > 0 for total in totals.values())
