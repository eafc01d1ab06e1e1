"""Where a transformer's dots go (``dew.runtime.cpu.dots``): oneDNN is kept only when its matrix
products cost the step more than the margin less, the decision is cached (a second start and a new
workdir measure nothing), a oneDNN route that fails or changes nothing is said and dropped, the
user's XLA_FLAGS win; the run's products are traced in this process before JAX starts; and real
measurement children on tiny products."""

from __future__ import annotations

import json
import os

import pytest
from helpers_common import ROOT

from dew.runtime.cpu import cache as kernel_cache
from dew.runtime.cpu import dots as dot_choice
from dew.runtime.cpu import flags as cpu_convolutions
from dew.runtime.cpu.choice import Decision, choose
from dew.runtime.cpu.dots import ShapeSource
from dew.training import traced_dots


def _nowhere(**_):
    raise AssertionError("these tests trace through Children.trace")


CPU = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
DENSE, ATTENTION = [1, 1024, 128, 512, 1], [256, 16, 32, 16, 0]
SHAPES = {"batch": 64, "dots": [[*DENSE, 8], [*ATTENTION, 4]]}
SOURCE = ShapeSource(_nowhere, {}, {"model": "SiT-S/2", "batch": 64})
# Seconds per call of a product's forward and both gradients, by route.
FASTER = {"xla": {json.dumps(DENSE): 0.010, json.dumps(ATTENTION): 0.002}}
FASTER["onednn"] = {json.dumps(DENSE): 0.006}  # the attention class: the same program as XLA's


class Children:
    """A stand-in for the timing children: answers from ``times`` by the route its XLA_FLAGS name;
    a class the route's row lacks compiles to XLA's program (listed unchanged). ``failing``:
    ``"child"`` (oneDNN's child dies), ``"onednn"`` (oneDNN's cannot compile a program) or
    ``"every"`` (no route can)."""

    def __init__(self, times=FASTER, failing=None):
        self.times, self.failing, self.calls = times, failing, []

    def trace(self, source):
        self.calls.append(("trace", None))
        return SHAPES

    def __call__(self, payload, environment):
        route = "onednn" if cpu_convolutions.ONEDNN_DOTS in environment.get("XLA_FLAGS", "") else "xla"
        self.calls.append(("dots", route))
        if route == "onednn" and self.failing == "child":
            raise RuntimeError("the kernel measurement child (dots) failed: partition compile failed")
        names = [json.dumps(d) for d in payload["dots"]]
        rows = self.times.get(route, {})
        answer = {
            "times": {n: rows[n] for n in names if n in rows},
            "programs": {n: f"{route}:{n}" for n in names},
            "unchanged": [n for n in names if n not in rows],
            "failed": [],
        }
        if self.failing == "every" or (self.failing == "onednn" and route == "onednn"):
            answer.update(times={}, failed=[[names[0], "XlaRuntimeError: partition compile failed"]])
        return answer


def choose_with(cache, children, *, machine_cache=None, environ=CPU, log=None):
    return choose(
        "auto",
        "auto",
        shapes=SOURCE,
        devices=2,
        cache=None if cache is None else str(cache),
        machine_cache=None if machine_cache is None else str(machine_cache),
        runner=children,
        tracer=children.trace,
        environ=environ,
        log=log,
    )


def test_onednn_is_kept_where_it_is_faster_and_the_decision_is_cached(machine, tmp_path):
    children = Children()
    decision = choose_with(tmp_path / "w" / "k.json", children, machine_cache=tmp_path / "m.json")
    # XLA: 8·10 + 4·2 = 88 ms; oneDNN: 8·6 + 4·2 = 56 ms (the attention class compiled the same).
    assert decision.dots == "onednn" and children.calls == [
        ("trace", None),
        ("dots", "xla"),
        ("dots", "onednn"),
    ]
    assert "dots measured in" in decision.how and "xla 88 ms, onednn 56 ms" in decision.how
    assert dot_choice.NOT_CACHED in decision.how and "dots on oneDNN" in decision.line()
    # The convolutions keep the CPU-flag rule (a transformer has none measured).
    assert decision.how.startswith("CPU-flag rule: convolutions are not timed; dots")
    assert Decision.from_record(decision.record(), "recorded").dots == "onednn"
    children.calls.clear()
    again = choose_with(tmp_path / "w" / "k.json", children, machine_cache=tmp_path / "m.json")
    assert children.calls == [] and again.dots == "onednn" and "dots cached from" in again.how
    fresh = choose_with(tmp_path / "new" / "k.json", children, machine_cache=tmp_path / "m.json")
    assert children.calls == [] and fresh.dots == "onednn" and "dots cached for this machine" in fresh.how
    written = json.loads((tmp_path / "new" / "k.json").read_text())
    assert set(written["dot_decisions"]) and "decisions" not in written


def test_within_the_margin_xla_keeps_the_dots(machine, tmp_path):
    close = {"xla": FASTER["xla"], "onednn": {c: t * 0.99 for c, t in FASTER["xla"].items()}}
    decision = choose_with(tmp_path / "k.json", Children(close))
    assert decision.dots == "xla" and dot_choice.NOT_CACHED not in decision.how
    assert decision.line().endswith(f"({decision.how})") and "dots on oneDNN" not in decision.line()


@pytest.mark.parametrize(
    ("failing", "said"),
    [
        ("child", "onednn: its measurement child failed (the kernel measurement child (dots) failed"),
        ("onednn", "onednn: XLA could not compile 1 of its programs here (first: "),
        ("unchanged", "onednn: not used by XLA on this CPU"),
    ],
)
def test_a_onednn_route_that_fails_or_changes_nothing_is_said_and_dropped(machine, tmp_path, failing, said):
    unchanged = failing == "unchanged"
    children = Children({"xla": FASTER["xla"]}) if unchanged else Children(failing=failing)
    decision = choose_with(tmp_path / "k.json", children)
    assert decision.dots == "xla" and said in decision.how and "xla 88 ms" in decision.how


def test_xla_failing_keeps_its_dots_and_says_so(machine, tmp_path):
    lines = []
    children = Children(failing="every")
    decision = choose_with(tmp_path / "k.json", children, log=lines.append)
    assert decision.dots == "xla" and decision.how.endswith("dots XLA's: the measurement failed")
    assert any("the matrix-product measurement failed" in line for line in lines)
    assert children.calls == [("trace", None), ("dots", "xla")]


def test_the_users_flags_or_an_xla_without_onednn_measure_nothing(machine, tmp_path):
    children = Children()
    flagged = {**CPU, "XLA_FLAGS": f"{CPU['XLA_FLAGS']} {cpu_convolutions.ONEDNN_DOTS}"}
    decision = choose_with(tmp_path / "k.json", children, environ=flagged)
    assert decision.how.endswith("dots as XLA_FLAGS says") and children.calls == []
    machine.setattr(cpu_convolutions, "xla_knows_onednn_dots", lambda: False)
    decision = choose_with(tmp_path / "k.json", children)
    assert decision.how.endswith("oneDNN is not in this jaxlib's XLA") and children.calls == []


def test_a_malformed_dots_entry_is_measured_again(machine, tmp_path):
    cache = tmp_path / "k.json"
    choose_with(cache, Children())
    data = json.loads(cache.read_text())
    (key,) = data["dot_decisions"]
    data["dot_decisions"][key]["times"]["xla"] = {}
    cache.write_text(json.dumps(data))
    children = Children()
    assert choose_with(cache, children).dots == "onednn"
    assert ("dots", "xla") in children.calls
    with pytest.raises(ValueError, match="no time of xla"):
        kernel_cache.valid_dot_decision(data["dot_decisions"][key])
    with pytest.raises(ValueError, match="split 3"):
        kernel_cache.valid_dot_shapes({"batch": 2, "dots": [[1, 2, 3, 4, 3, 1]]})


def test_transformers_measure_their_dots_and_no_other_model_measures_anything():
    from ml_collections import ConfigDict

    def source(name):
        found = traced_dots.run_dots(ConfigDict({"model": {"name": name}, "dataset": {"batch_size": 8}}), 2)
        return None if found is None else found.function

    for name in ("dit", "sit", "imf_dit", "SiT-S/2", "DiT-XL/2", "iMF-B/2"):
        assert source(name) is traced_dots.trace_dots
    assert source("songunet") is None and source("mlp") is None


def test_the_run_s_products_are_traced_before_jax_starts():
    """``trace_dots`` on a tiny SiT: every block's products counted once per block, dense layers
    split over their rows and attention over its batch·heads, at the run's batch; the backend
    untouched."""
    from dew.config import load_config
    from dew.runtime.backend import backend_started
    from dew.training.trainer import resolve_config

    started = backend_started()
    config = resolve_config(load_config(str(ROOT / "experiments" / "sit.py") + ":digits"))
    config.model.depth = 3
    with dot_choice.without_backend():
        traced = traced_dots.trace_dots(config, 2)
    assert backend_started() == started
    tokens, width, heads = 16, config.model.hidden_size, config.model.num_heads
    rows = {tuple(r[:5]): r[5] for r in traced["dots"]}
    assert traced["batch"] == config.dataset.batch_size == 64
    assert rows[(1, 64 * tokens, width, 3 * width, 1)] == 3  # each block's qkv
    assert rows[(1, 64 * tokens, 4 * width, width, 1)] == 3  # each block's second MLP layer
    attention = [(r, n) for r, n in rows.items() if r[4] == 0]
    assert attention and all(r[0] == 64 * heads and n == 3 for r, n in attention)


def test_real_children_time_every_class_under_both_routes():
    """XLA's child times each class; oneDNN's times each or names it unchanged (no CPU assumed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    payload = {"dots": [[1, 8, 4, 6, 1], [4, 3, 5, 2, 0], [1, 1, 3, 2, 2]]}
    base = dot_choice.run_probe(payload, env)
    names = [json.dumps(d) for d in payload["dots"]]
    assert sorted(base["times"]) == sorted(names) and all(0 < t < 10 for t in base["times"].values())
    assert base["failed"] == [] and base["unchanged"] == [] and sorted(base["programs"]) == sorted(names)
    if not cpu_convolutions.xla_knows_onednn_dots():
        pytest.skip("this jaxlib's XLA has no oneDNN flags")
    onednn = dot_choice.run_probe(
        {**payload, "same_as": base["programs"]}, dot_choice.route_environment("onednn", env)
    )
    assert sorted([*onednn["times"], *onednn["unchanged"]]) == sorted(names) and onednn["failed"] == []


def test_products_are_counted_once_per_scan_iteration_and_split_where_the_batch_is():
    """``count_dots`` on a program of known products: a dense layer at batch 8 (split over its rows,
    rescaled to the step's batch 4), a product inside a 3-step scan (counted 3 times) and a
    per-head attention product (split over its batch dimension)."""
    import jax
    import jax.numpy as jnp

    from dew.training.traced_dots import count_dots

    def program(x, w, q):
        h = x @ w  # [8, 16] · [16, 32]

        def body(carry, _):
            return carry @ jnp.eye(32), None

        h, _ = jax.lax.scan(body, h, None, length=3)
        return h, jnp.einsum("bhtd,bhsd->bhts", q, q)

    shapes = (jnp.zeros((8, 16)), jnp.zeros((16, 32)), jnp.zeros((8, 2, 5, 4)))
    seen = count_dots(jax.make_jaxpr(program)(*shapes).jaxpr, 8, 4)
    assert seen == {(1, 4, 16, 32, 1): 1, (1, 4, 32, 32, 1): 3, (8, 5, 4, 5, 0): 1}
