"""The CPU kernels a run uses, chosen by timing them on the machine at hand, as
``torch.backends.cudnn.benchmark`` does, instead of by a CPU-flag rule.

Two choices change how fast XLA:CPU trains a convolutional network, never what it computes beyond
float32 reassociation (each choice is one program, bit-for-bit reproducible):

- the convolution library (``config.runtime.cpu_convolutions``): YNNPACK, XLA's default, or
  Eigen (``dew.runtime.cpu_convolutions``). It is an XLA flag read once, when JAX starts its CPU
  backend, so each library is timed in a child process started with that flag;
- the weight gradient of each convolution shape class (``config.runtime.cpu_weight_gradient``):
  XLA's, or the sum over kernel taps (``dew.networks.edm_layers``), chosen class by class.

``choose`` makes the decision before this process starts JAX. With ``auto`` it times, for every
shape class the run's network traces (``dew.kernels.record_convolutions``; traced in THIS process
before its backend starts, so the caller's registrations are in effect, by a function named rather
than imported: ``ShapeSource``), in a child process per library given only the shapes (``python -m
dew.kernel_probe time``), the convolution's forward pass and both gradients at the run's batch
over the run's CPU devices, with each library and each weight gradient, and keeps the fastest: the
library whose convolutions, each class weighted by how often the network uses it and taking its
faster weight gradient, cost the step least; then, under that library, the per-tap gradient for
exactly the classes where it was faster. Within ``TIE`` (2 %) the default (YNNPACK, XLA's
gradient) is kept.

The decision is cached as JSON (``CACHE_FILE``, in the workdir's ``cache`` folder, and a copy for
the whole machine in ``machine_cache_path``: ``~/.cache/dew``, beside its compiled programs) keyed
by the CPU (``cpu_model``), the jaxlib version, the device count, the batch and the shape classes,
and the traced shape classes by the config sections that shape the network, so a second run of the
same configuration, in the same workdir or a new one, starts no child process. A forced value in
the config overrides the cache; a resumed run uses the choice recorded in its ``run.json``
(``Decision.record``) for every setting left at ``auto``. Nothing is measured unless the backend
will be the CPU: with an accelerator the settings change nothing (``cpu_backend_expected``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dew import kernels
from dew.runtime import cpu_convolutions
from dew.runtime.kernel_cache import (
    CACHE_FILE,
    LIBRARIES,
    MACHINE_CACHE_VARIABLE,
    WEIGHT_GRADIENTS,
    _remember,
    cache_path,
    machine_cache_path,
    read_cache,
    valid_decision,
    valid_shapes,
    writable,
    write_cache,
)

LIBRARY_CHOICES = cpu_convolutions.CHOICES  # auto, eigen, ynnpack
WEIGHT_GRADIENT_CHOICES = ("auto", "xla", "per_tap")
PROBE_MODULE = "dew.kernel_probe"
#: Relative margin within which the default (YNNPACK, XLA's gradient) is kept over a faster one.
TIE = 0.02

#: ``runner(mode, payload, environment) -> dict``: one measurement child's answer.
Runner = Callable[[str, Mapping[str, Any], Mapping[str, str]], dict]


@dataclasses.dataclass(frozen=True)
class Decision:
    """The convolution library, the shape classes that take the per-tap weight gradient, and
    ``how`` (one line: measured times, cached from a file, forced by config, recorded, rule)."""

    library: str
    per_tap: frozenset | None
    how: str
    per_tap_from: int | None = None  # the rule's pixel threshold, where no classes were measured

    def kernel_choice(self) -> kernels.KernelChoice:
        if self.per_tap is None:
            return kernels.KernelChoice(self.per_tap_from, self.how)
        return kernels.KernelChoice(None, self.how, per_tap_convolutions=self.per_tap)

    def record(self) -> dict:
        """The JSON a run stores with its starts (``run.json``), read back by ``from_record``."""
        per_tap = None if self.per_tap is None else sorted(list(c) for c in self.per_tap)
        return {"library": self.library, "per_tap": per_tap, "per_tap_from": self.per_tap_from}

    @classmethod
    def from_record(cls, record: Mapping[str, Any], how: str) -> Decision:
        per_tap = record.get("per_tap")
        return cls(
            record["library"],
            None if per_tap is None else frozenset(tuple(int(v) for v in c) for c in per_tap),
            how,
            record.get("per_tap_from"),
        )

    def line(self) -> str:
        """What the run prints: the library, the per-tap classes, and why."""
        if self.per_tap is None:
            gradient = f"per-tap from {self.per_tap_from} pixels" if self.per_tap_from else "XLA's"
        else:
            gradient = f"per-tap for {len(self.per_tap)} shape class(es)" if self.per_tap else "XLA's"
        return f"convolutions on {self.library}, weight gradients {gradient} ({self.how})"


#: Set to 1, ``auto`` settings take the CPU-flag rule (``dew.runtime.cpu_convolutions``) instead
#: of measuring: for test suites and CI jobs, where many short runs of many shapes would each pay
#: the measurement, and kernel speed matters less than start-up. A recorded or forced choice wins.
BY_RULE_VARIABLE = "DEW_KERNELS_BY_RULE"


def cpu_model() -> str:
    """The CPU as the cache knows it: /proc/cpuinfo's model name, family and model, the core
    count and a digest of the feature flags (VMs may name different CPUs alike, 'AMD EPYC')."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        import platform

        fields["model name"] = platform.processor() or platform.machine()
    flags = hashlib.sha256(fields.get("flags", fields.get("Features", "")).encode()).hexdigest()[:8]
    return (
        f"{fields.get('model name', 'unknown')} (family {fields.get('cpu family', '?')}, model "
        f"{fields.get('model', '?')}, {os.cpu_count()} cores, flags {flags})"
    )


def jaxlib_version() -> str:
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cpu_backend_expected(environ: Mapping[str, str] | None = None) -> bool:
    """Whether JAX will run on the CPU: ``JAX_PLATFORMS`` (or ``JAX_PLATFORM_NAME``) names cpu
    first, or neither is set and no accelerator plugin is installed."""
    environ = os.environ if environ is None else environ
    named = environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME") or ""
    if named.strip():
        return named.split(",")[0].strip().lower() == "cpu"
    plugins = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "libtpu")
    return not any(importlib.util.find_spec(name) is not None for name in plugins)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def decision_key(
    cpu: str, jaxlib: str, devices: int, batch: int, convolutions: Sequence[Sequence[int]]
) -> str:
    """The cache key of a measured decision: CPU, jaxlib, device count, batch, shape classes."""
    classes = sorted(list(map(int, c[:6])) for c in convolutions)
    return _digest({"cpu": cpu, "jaxlib": jaxlib, "devices": devices, "batch": batch, "classes": classes})


def run_probe(mode: str, payload: Mapping[str, Any], environment: Mapping[str, str]) -> dict:
    """One measurement child, ``python -m dew.kernel_probe <mode>`` (``time``: only convolution
    shapes, nothing the user configured): the payload on its stdin, its answer the last line of
    its stdout (JSON). The child's compilation cache is off. Raises RuntimeError naming the
    child's last line of stderr when it fails."""
    env = dict(environment)
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    done = subprocess.run(
        [sys.executable, "-m", PROBE_MODULE, mode],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the kernel measurement child ({mode}) failed: {tail}")
    return json.loads(lines[-1])


def library_environment(library: str, environ: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with ``XLA_FLAGS`` routing convolutions to ``library``."""
    env = dict(environ)
    if library == "eigen":
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {cpu_convolutions.EIGEN_ROUTE}".strip()
    return env


def decide(
    times: Mapping[str, Mapping[str, Mapping[str, float]]],
    counts: Mapping[str, int],
    libraries: Sequence[str],
    gradients: Sequence[str],
) -> tuple[str, frozenset, dict[str, float]]:
    """From ``times[library][class][gradient]`` (seconds) and ``counts[class]`` (uses in the
    network; classes as ``json.dumps`` of the 6-tuple): the library, the per-tap classes and each
    library's weighted total. Ties within ``TIE`` go to the default (first) candidate."""

    def best(row: Mapping[str, float]) -> tuple[str, float]:
        chosen = gradients[0]
        for g in gradients[1:]:
            if row[g] < row[chosen] * (1 - TIE):
                chosen = g
        return chosen, row[chosen]

    totals = {lib: sum(counts[c] * best(times[lib][c])[1] for c in counts) for lib in libraries}
    library = libraries[0]
    for lib in libraries[1:]:
        if totals[lib] < totals[library] * (1 - TIE):
            library = lib
    per_tap = frozenset(tuple(json.loads(c)) for c in counts if best(times[library][c])[0] == "per_tap")
    return library, per_tap, totals


_applied: Decision | None = None


def set_applied(decision: Decision | None) -> None:
    """Note the decision this process runs with (``dew.runtime.start`` does)."""
    global _applied
    _applied = decision


def applied_record() -> dict | None:
    """The record of the decision this process runs with, for its ``run.json`` (None when
    ``start`` made none), with the CPU and jaxlib it was made for."""
    if _applied is None:
        return None
    return {**_applied.record(), "how": _applied.how, "cpu": cpu_model(), "jaxlib": jaxlib_version()}


@dataclasses.dataclass(frozen=True)
class ShapeSource:
    """Where the run's convolution shape classes come from: ``function`` ("module:function",
    called in THIS process, before JAX starts its backend, with ``args``; it returns
    ``{"batch", "convolutions"}`` and raises for a config the run would refuse), and ``key``,
    what the traced classes depend on (JSON; the cache's key for them). Named rather than
    imported: the function builds what a run builds, in the layers above the runtime."""

    function: str
    args: Mapping[str, Any]
    key: Any

    def trace(self) -> dict:
        """Call ``function`` without starting JAX's backend (see ``_without_backend``)."""
        module, _, name = self.function.partition(":")
        traced = getattr(importlib.import_module(module), name)
        with _without_backend():
            return valid_shapes(traced(**self.args))


#: ``tracer(source) -> {"batch", "convolutions"}``: the run's traced shapes (``ShapeSource.trace``).
Tracer = Callable[[ShapeSource], dict]


@contextlib.contextmanager
def _without_backend(platform: str = "cpu") -> Any:
    """Trace as if JAX's default backend were ``platform`` without starting it: layers ask
    ``jax.default_backend()`` at trace time (which would start the backend and fix XLA's flags
    before the kernel choice could set them). Only measured runs trace here, and they are
    measured only where the backend will be the CPU (``cpu_backend_expected``). Raises
    RuntimeError if tracing started the backend (it was not started before)."""
    import jax

    from dew.runtime.host_devices import backend_started

    before, real = backend_started(), jax.default_backend
    jax.default_backend = lambda: platform
    try:
        yield
    finally:
        jax.default_backend = real
    if not before and backend_started():
        raise RuntimeError("tracing the run's network started JAX's backend")


def _rule(
    libraries: Sequence[str], gradients: Sequence[str], environ: Mapping[str, str], why: str
) -> Decision:
    """The CPU-flag rule (``dew.runtime.cpu_convolutions``), for ``why`` nothing was measured."""
    library = libraries[0]
    if len(libraries) > 1 and cpu_convolutions.eigen_measured_faster():
        library = "eigen"
    if len(gradients) == 1:
        forced_gradient = frozenset() if gradients[0] == "xla" else None
        return Decision(library, forced_gradient, f"config; {why}", 1 if gradients[0] == "per_tap" else None)
    flags = library_environment(library, environ).get("XLA_FLAGS", "")
    rule = cpu_convolutions.weight_gradient_choice(xla_flags=flags).per_tap_weight_gradient_from
    return Decision(library, None, f"CPU-flag rule: {why}", rule)


def choose(
    library_setting: str,
    gradient_setting: str,
    *,
    shapes: ShapeSource | None,
    devices: int,
    cache: str | None,
    machine_cache: str | None = None,
    recorded: Mapping[str, Any] | None = None,
    recorded_in: str = "run.json",
    runner: Runner | None = None,
    tracer: Tracer | None = None,
    environ: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> Decision:
    """The kernel decision for a run, before JAX starts (see the module docstring).

    ``library_setting``/``gradient_setting``: ``config.runtime.cpu_convolutions`` /
    ``cpu_weight_gradient``. ``recorded``: the decision a resumed run recorded (``Decision.record``),
    used for the settings left at ``auto``. ``cache``: the workdir's decisions (beside its
    compilation cache; None without a workdir); ``machine_cache``: the machine's
    (``machine_cache_path``), read when the workdir has none and written with every measurement,
    so a new workdir on a measured machine measures nothing either. ``XLA_FLAGS`` already
    choosing the library wins over everything for the library. ``tracer``: the run's shapes
    (default ``ShapeSource.trace``, in this process); ``runner``: the timing children (default
    ``run_probe``). ``log``: where the lines a person should see go (a measurement starting, a
    cache set aside or not written).

    Nothing is measured for a config the run will refuse: the shapes are traced first, with the
    run's own checks, and a trace that raises leaves the rule's decision, so the run stops where
    and as it would without a measurement. Neither is anything measured when the workdir's cache
    cannot be written (the run cannot write its workdir either). A cache file is a hint: what
    is malformed in it is said, measured again and replaced; one that cannot be written is said
    once. A timing child that fails leaves the rule's decision, said in one line.
    Raises ValueError for an unknown setting."""
    if library_setting not in LIBRARY_CHOICES:
        raise ValueError(
            f"config.runtime.cpu_convolutions must be one of {', '.join(map(repr, LIBRARY_CHOICES))}, "
            f"got {library_setting!r}"
        )
    if gradient_setting not in WEIGHT_GRADIENT_CHOICES:
        raise ValueError(
            "config.runtime.cpu_weight_gradient must be one of "
            f"{', '.join(map(repr, WEIGHT_GRADIENT_CHOICES))}, got {gradient_setting!r}"
        )
    runner = run_probe if runner is None else runner
    tracer = ShapeSource.trace if tracer is None else tracer
    environ = dict(os.environ if environ is None else environ)
    flagged = cpu_convolutions.library_in_flags(environ.get("XLA_FLAGS", ""))
    libraries = (flagged,) if flagged else (LIBRARIES if library_setting == "auto" else (library_setting,))
    if "eigen" in libraries and not flagged and not cpu_convolutions.xla_knows_the_flag():
        if library_setting == "eigen":
            raise ValueError(
                "config.runtime.cpu_convolutions='eigen': this jaxlib's XLA has no "
                f"{cpu_convolutions.FLAG} flag; use 'auto' or 'ynnpack'"
            )
        libraries = ("ynnpack",)
    gradients = WEIGHT_GRADIENTS if gradient_setting == "auto" else (gradient_setting,)
    forced_gradient = frozenset() if gradient_setting == "xla" else None
    forced_from = 1 if gradient_setting == "per_tap" else None  # every convolution

    def forced(library: str, how: str) -> Decision:
        return Decision(library, forced_gradient, how, forced_from)

    if len(libraries) == 1 and len(gradients) == 1:
        return forced(libraries[0], "XLA_FLAGS and config" if flagged else "forced by config")
    if recorded is not None:
        chosen = Decision.from_record(recorded, f"recorded with the run's checkpoints in {recorded_in}")
        library = chosen.library if len(libraries) > 1 else libraries[0]
        if len(gradients) == 1:
            how = chosen.how + ", weight gradient forced by config"
            return Decision(library, forced_gradient, how, forced_from)
        return dataclasses.replace(chosen, library=library)
    if not cpu_backend_expected(environ):
        return Decision(libraries[0], frozenset(), "not measured: the backend is not the CPU")
    if environ.get(BY_RULE_VARIABLE) == "1":
        return _rule(libraries, gradients, environ, f"{BY_RULE_VARIABLE}=1 asks for no measurement")
    if shapes is None:  # another model; a reader without a run config (dew.sample)
        return _rule(libraries, gradients, environ, "no convolutions of a measured model to time")

    workdir, machine = read_cache(cache, log), read_cache(machine_cache, log)
    data = {part: {**machine[part], **workdir[part]} for part in ("decisions", "shapes")}
    cpu, jaxlib = cpu_model(), jaxlib_version()
    shape_key = _digest({"source": shapes.key, "devices": devices, "jaxlib": jaxlib})
    started = time.perf_counter()
    traced, checked = data["shapes"].get(shape_key), False

    def trace() -> dict:
        nonlocal checked
        answer = tracer(shapes)
        checked = True
        _remember(cache, "shapes", shape_key, answer, log)
        _remember(machine_cache, "shapes", shape_key, answer, log)
        return answer

    try:
        traced = traced or trace()
    except Exception as e:  # the run's own checks raise it again, where and as they would
        return _rule(libraries, gradients, environ, f"not measured, the run's shapes did not trace ({e})")
    classes = [tuple(int(v) for v in c[:6]) for c in traced["convolutions"]]
    uses = [int(row[6]) for row in traced["convolutions"]]
    counts = {json.dumps(list(c)): n for c, n in zip(classes, uses, strict=True)}
    key = decision_key(cpu, jaxlib, devices, int(traced["batch"]), classes)
    cached = data["decisions"].get(key)
    if cached is not None and set(cached["counts"]) != set(counts):
        cached = None  # a digest collision or a hand edit: not these shapes
    if cached is None or any(lib not in cached["times"] for lib in libraries):
        try:
            if not checked:
                trace()  # the run's checks, before anything is measured
        except Exception as e:
            return _rule(libraries, gradients, environ, f"not measured, the run's shapes did not trace ({e})")
        if cache is not None and not writable(cache):
            return _rule(libraries, gradients, environ, f"not measured, {cache} cannot be written")
        times = dict(cached["times"]) if cached else {}
        try:
            for library in libraries:
                if library in times:
                    continue
                if log is not None:
                    log(f"timing {len(classes)} convolution shape classes with {library} (once per machine)")
                payload = {"batch": int(traced["batch"]), "convolutions": [list(c) for c in classes]}
                times[library] = runner("time", payload, library_environment(library, environ))["times"]
            cached = valid_decision({"counts": counts, "times": times})
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            if log is not None:
                log(f"the kernel measurement failed ({e}): using the CPU-flag rule")
            return _rule(libraries, gradients, environ, "the measurement failed")
        cached = {
            "cpu": cpu,
            "jaxlib": jaxlib,
            "devices": devices,
            "batch": int(traced["batch"]),
            "counts": counts,
            "times": times,
            "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "measure_s": round(time.perf_counter() - started, 2),
        }
        _remember(cache, "decisions", key, cached, log)
        _remember(machine_cache, "decisions", key, cached, log)
        source = f"measured in {cached['measure_s']:.1f} s"
    elif key in workdir["decisions"]:
        source = f"cached from {cache}"
    else:  # measured on this machine for another workdir: the workdir keeps its own copy too
        _remember(cache, "decisions", key, cached, log)
        source = f"cached for this machine in {machine_cache}"
    library, per_tap, totals = decide(cached["times"], cached["counts"], libraries, gradients)
    if len(gradients) == 1:
        per_tap, per_tap_from = forced_gradient, forced_from
    else:
        per_tap_from = None
    summary = ", ".join(f"{lib} {1e3 * totals[lib]:.0f} ms" for lib in libraries)
    how = f"{source}: the step's convolutions {summary}"
    if len(gradients) == 1:
        how += "; weight gradient forced by config"
    return Decision(library, per_tap, how, per_tap_from)


__all__ = [
    "BY_RULE_VARIABLE",
    "CACHE_FILE",
    "MACHINE_CACHE_VARIABLE",
    "Decision",
    "ShapeSource",
    "applied_record",
    "cache_path",
    "choose",
    "cpu_backend_expected",
    "cpu_model",
    "decide",
    "decision_key",
    "jaxlib_version",
    "machine_cache_path",
    "read_cache",
    "run_probe",
    "set_applied",
    "valid_decision",
    "valid_shapes",
    "write_cache",
]
