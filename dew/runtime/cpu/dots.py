"""Where a transformer's matrix products go on XLA:CPU, chosen by timing them on the machine at hand.

A transformer (the DiT family: DiT, SiT, REPA's SiT, iMF's DiT) spends its step in matrix
products, which XLA:CPU can hand to oneDNN, the library PyTorch runs on CPUs (``flags.ONEDNN_DOTS``),
or keep on its default (YNNPACK). Which is faster depends on the CPU and the shapes (SiT-S/2's
step on a 2-core AMD EPYC: 1,121 ms with XLA's dots, 808 ms with oneDNN's), and oneDNN can abort
the process compiling a product it cannot partition, so it is measured, never assumed:

- the run's products are traced in the run's own process before JAX starts by the function its
  caller hands over (``ShapeSource``: ``dew.training.traced_dots.trace_dots``, every
  ``dot_general`` of the network's forward pass as a batched product ``[b, m, k] · [b, k, n]``
  with how often it occurs);
- one child per route (``python -m dew.runtime.cpu.probe``: XLA's dots, then ``ONEDNN_DOTS``)
  times each class's forward and both gradients at the run's batch over its devices. A oneDNN
  program that compiles to XLA's own is not timed again; a route whose child fails or cannot
  compile a program is dropped and said, as one that changes nothing is said unused;
- oneDNN is kept only when the products, weighted by use, cost the step at least ``TIE`` less.

The decision is cached (``dew.runtime.cpu.cache``), keyed by the CPU, jaxlib, device count, batch
and classes, so a later start in any workdir measures nothing. XLA cannot keep a program with
oneDNN's fusions in the persistent compilation cache, so with oneDNN's dots every start compiles
the step again; the run's ``kernel choice:`` line says so (``NOT_CACHED``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dew.runtime.cpu import flags
from dew.runtime.cpu.cache import (
    TIE,
    _remember,
    digest,
    kept,
    read_cache,
    stamped,
    valid_dot_shapes,
    writable,
)

PROBE_MODULE = "dew.runtime.cpu.probe"
#: ``runner(payload, environment) -> dict``: one measurement child's answer (``run_probe``).
Runner = Callable[[Mapping[str, Any], Mapping[str, str]], dict]


@dataclasses.dataclass(frozen=True)
class ShapeSource:
    """Where a run's matrix products come from: ``function(**arguments)`` (handed over by the
    caller, which imports it: the layers above the runtime build what a run builds), called in
    THIS process before JAX starts its backend; it returns ``{"batch", "dots"}`` and raises for a
    config the run would refuse. ``key``: what the traced classes depend on (JSON; their cache key)."""

    function: Callable[..., dict]
    arguments: Mapping[str, Any]
    key: Any

    def trace(self) -> dict:
        """Call ``function`` without starting JAX's backend (``without_backend``)."""
        with without_backend():
            answer = self.function(**self.arguments)
        return valid_dot_shapes(answer)


@contextlib.contextmanager
def without_backend(platform: str = "cpu") -> Iterator[None]:
    """Trace as if JAX's default backend were ``platform`` without starting it: layers ask
    ``jax.default_backend()`` at trace time, which would start the backend and fix XLA's flags
    before the routes could set them. Raises RuntimeError if tracing started the backend."""
    import jax

    from dew.runtime.backend import backend_started

    before, real = backend_started(), jax.default_backend
    jax.default_backend = lambda: platform
    try:
        yield
    finally:
        jax.default_backend = real
    if not before and backend_started():
        raise RuntimeError("tracing the run's network started JAX's backend")


def run_probe(payload: Mapping[str, Any], environment: Mapping[str, str]) -> dict:
    """One measurement child, ``python -m dew.runtime.cpu.probe`` (only product shapes, nothing
    the user configured): the payload on its stdin, its answer the last line of its stdout (JSON).
    The child's compilation cache is off. Raises RuntimeError naming the child's last line of
    stderr when it fails, and the program it was compiling (a library that aborts the process
    raises nothing the child could catch)."""
    env = {**environment, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    done = subprocess.run(
        [sys.executable, "-m", PROBE_MODULE],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        said = done.stderr.strip().splitlines()
        tail = (said or ["(no output)"])[-1]
        doing = [line for line in said if line.startswith("compiling ")]
        where = f", {doing[-1]}" if doing and doing[-1] != tail else ""
        raise RuntimeError(f"the kernel measurement child failed: {tail}{where}")
    return json.loads(lines[-1])


#: The routes a dots decision times, the default first.
DOT_ROUTES = ("xla", "onednn")
#: Why a start with oneDNN's dots compiles again, said on the kernel choice's line.
NOT_CACHED = (
    "programs with oneDNN's dots are compiled at every start (XLA cannot keep them in the compilation cache)"
)


def route_environment(route: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with ``XLA_FLAGS`` handing dots to oneDNN for the ``onednn`` route."""
    env = dict(environ)
    if route == "onednn":
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags.ONEDNN_DOTS}".strip()
    return env


def decide_dots(
    times: Mapping[str, Mapping[str, float]], counts: Mapping[str, int]
) -> tuple[str, dict[str, float]]:
    """From ``times[route][class]`` (seconds of a product's forward and both gradients) and
    ``counts[class]`` (uses in the network): the route, and each route's weighted total. oneDNN
    wins only by more than ``TIE``; XLA's default is kept otherwise."""
    timed = [route for route in DOT_ROUTES if route in times]
    totals = {route: sum(counts[c] * times[route][c] for c in counts) for route in timed}
    faster = "onednn" in totals and totals["onednn"] < totals["xla"] * (1 - TIE)
    return ("onednn" if faster else "xla"), totals


def _measure(
    counts: Mapping[str, int],
    environ: Mapping[str, str],
    runner: Runner,
    log: Callable[[str], None] | None,
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Each route's child: ``(times[route][class], unused[route] -> why)``. Raises RuntimeError
    when XLA's own route cannot be timed (then nothing is decided)."""
    if log is not None:
        log(f"timing {len(counts)} matrix-product classes with XLA's dots and oneDNN's (once per machine)")
    times: dict[str, dict[str, float]] = {}
    unused: dict[str, str] = {}
    programs: dict[str, str] = {}
    for route in DOT_ROUTES:
        payload: dict[str, Any] = {"dots": [json.loads(c) for c in counts]}
        if route != "xla":
            payload["same_as"] = programs
        try:
            answer = runner(payload, route_environment(route, environ))
        except RuntimeError as e:
            if route == "xla":
                raise
            unused[route] = f"its measurement child failed ({e})"
            continue
        failed, same = answer.get("failed", []), answer.get("unchanged", [])
        if failed:
            name, error = failed[0]
            why = f"XLA could not compile {len(failed)} of its programs here (first: {name}: {error})"
            if route == "xla":
                raise RuntimeError(why)
            unused[route] = why
            continue
        if route != "xla" and len(same) == len(counts):
            unused[route] = "not used by XLA on this CPU (the same programs as XLA's)"
            continue
        rows = {name: float(s) for name, s in answer["times"].items()}
        for name in same:
            rows[name] = times["xla"][name]
        times[route] = rows
        if route == "xla":
            programs = dict(answer.get("programs", {}))
    return times, unused


def choose_dots(
    shapes: ShapeSource,
    *,
    cpu: str,
    jaxlib: str,
    devices: int,
    cache: str | None,
    machine_cache: str | None,
    runner: Runner,
    tracer: Callable[[ShapeSource], dict],
    environ: Mapping[str, str],
    log: Callable[[str], None] | None = None,
) -> tuple[str, str]:
    """Where the run's dots go (``"xla"`` or ``"onednn"``) and how that was decided (a clause of
    the run's ``kernel choice:`` line), before JAX starts (see the module docstring).

    ``shapes``: the run's ``ShapeSource`` (its ``key`` keys the traced classes);
    ``tracer(shapes)``: ``{"batch", "dots"}`` (``ShapeSource.trace``); ``runner``: the timing
    children (``run_probe``); ``cache`` / ``machine_cache``: the workdir's
    and the machine's kernel caches. ``XLA_FLAGS`` naming oneDNN wins; a jaxlib without the
    flags keeps XLA's. Nothing is measured for shapes that do not trace (the run then stops
    where it would anyway) or a workdir whose cache cannot be written; a failed measurement
    keeps XLA's dots. Every such case is said in the returned clause."""
    given = environ.get("XLA_FLAGS", "")
    if flags.onednn_in_flags(given):
        return "xla", "dots as XLA_FLAGS says"
    if not flags.xla_knows_onednn_dots():
        return "xla", "dots XLA's: oneDNN is not in this jaxlib's XLA"
    workdir, machine = read_cache(cache, log), read_cache(machine_cache, log)
    data = {part: {**machine[part], **workdir[part]} for part in ("dot_shapes", "dot_decisions")}
    shape_key = digest({"source": shapes.key, "devices": devices, "jaxlib": jaxlib, "of": "dots"})
    traced = data["dot_shapes"].get(shape_key)
    started = time.perf_counter()
    if traced is None:
        try:
            traced = tracer(shapes)
        except Exception as e:  # the run's own checks raise it again, where and as they would
            return "xla", f"dots XLA's: not measured, the run's shapes did not trace ({e})"
        if not traced["dots"]:
            return "xla", "dots XLA's: the network has no matrix products"
        _remember(cache, "dot_shapes", shape_key, traced, log)
        _remember(machine_cache, "dot_shapes", shape_key, traced, log)
    counts = {json.dumps([int(v) for v in row[:5]]): int(row[5]) for row in traced["dots"]}
    batch = int(traced["batch"])
    key = digest({"cpu": cpu, "jaxlib": jaxlib, "devices": devices, "batch": batch, "dots": sorted(counts)})
    entry = data["dot_decisions"].get(key)
    if entry is not None and set(entry["counts"]) != set(counts):
        entry = None  # a digest collision or a hand edit: not these shapes
    measured = entry is None
    if entry is None:
        if cache is not None and not writable(cache):
            return "xla", f"dots XLA's: not measured, {cache} cannot be written"
        try:
            times, unused = _measure(counts, environ, runner, log)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            if log is not None:
                log(f"the matrix-product measurement failed ({e}): keeping XLA's dots")
            return "xla", "dots XLA's: the measurement failed"
        entry = stamped(
            {
                "cpu": cpu,
                "jaxlib": jaxlib,
                "devices": devices,
                "batch": batch,
                "counts": counts,
                "times": times,
                "unused": unused,
            },
            started,
        )
    dots, totals = decide_dots(entry["times"], entry["counts"])
    source = kept(
        "dot_decisions",
        key,
        entry,
        measured=measured,
        workdir=workdir,
        cache=cache,
        machine_cache=machine_cache,
        log=log,
    )
    summary = ", ".join(f"{route} {1e3 * total:.0f} ms" for route, total in totals.items())
    said = "".join(f"; {route}: {why}" for route, why in entry.get("unused", {}).items())
    how = f"dots {source}: the step's matrix products {summary}{said}"
    return dots, how + (f"; {NOT_CACHED}" if dots == "onednn" else "")


__all__ = [
    "DOT_ROUTES",
    "NOT_CACHED",
    "ShapeSource",
    "choose_dots",
    "decide_dots",
    "route_environment",
    "run_probe",
    "without_backend",
]
