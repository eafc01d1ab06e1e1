"""The CPU kernels a run uses, chosen by timing them on the machine at hand, as
``torch.backends.cudnn.benchmark`` does, instead of by a CPU-flag rule.

Two choices change how fast XLA:CPU trains a convolutional network, never what it computes
beyond float32 reassociation (each choice is one program, bit-for-bit reproducible):

- the convolution library (``config.runtime.cpu_convolutions``): YNNPACK, XLA's default, or
  Eigen (``dew.runtime.cpu_convolutions``). It is an XLA flag read once, when JAX starts its CPU
  backend, so each library is timed in a child process started with that flag;
- the weight gradient of each convolution shape class (``config.runtime.cpu_weight_gradient``):
  XLA's, or the sum over kernel taps (``dew.networks.edm_layers``), chosen class by class.

``choose`` makes the decision before this process starts JAX. With ``auto`` it times, for every
shape class the run's network traces (``dew.kernels.record_convolutions``; traced in a child
process, ``python -m dew.kernel_probe``, a process boundary rather than an import), the
convolution's forward pass and both gradients at the run's batch over the run's CPU devices, with
each library and each weight gradient, and keeps the fastest: the library whose convolutions,
each class weighted by how often the network uses it and taking its faster weight gradient,
cost the step least; then, under that library, the per-tap gradient for exactly the classes
where it was faster. Within ``TIE`` (2 %) the default (YNNPACK, XLA's gradient) is kept.

The decision is cached as JSON (``CACHE_FILE``, beside the compilation cache, and a copy for the
whole machine in ``machine_cache_path``: ``~/.cache/dew``) keyed by the CPU (``cpu_model``), the
jaxlib version, the device count, the batch and the shape classes, and the traced shape classes
by the config sections that shape the network, so a second run of the same configuration, in
the same workdir or a new one, starts no child process. A forced value in the config overrides
the cache; a resumed run uses the choice recorded in its ``run.json`` (``Decision.record``) for
every setting left at ``auto``. Nothing is measured unless the backend will be the CPU: with an
accelerator the settings change nothing (``cpu_backend_expected``).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dew import kernels
from dew.runtime import cpu_convolutions

LIBRARY_CHOICES = cpu_convolutions.CHOICES  # auto, eigen, ynnpack
WEIGHT_GRADIENT_CHOICES = ("auto", "xla", "per_tap")
LIBRARIES = ("ynnpack", "eigen")
WEIGHT_GRADIENTS = ("xla", "per_tap")
CACHE_FILE = "kernel_choice.json"
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


def read_cache(path: str | None) -> dict:
    if path is None or not os.path.exists(path):
        return {"decisions": {}, "shapes": {}}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {"decisions": {}, "shapes": {}}  # a damaged cache is measured anew and rewritten
    if not isinstance(data, dict):
        return {"decisions": {}, "shapes": {}}
    data.setdefault("decisions", {})
    data.setdefault("shapes", {})
    return data


def write_cache(path: str, data: Mapping[str, Any]) -> None:
    """Write atomically (a concurrent reader sees the old file or the new one)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kernel_choice.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def cache_path(compilation_cache_directory: str | None, workdir: str | None) -> str | None:
    """``CACHE_FILE`` beside the compilation cache directory (in its parent: for the default
    ``<workdir>/cache/jax``, ``<workdir>/cache/kernel_choice.json``); with the compilation cache
    off, in ``<workdir>/cache``; None without either."""
    if compilation_cache_directory:
        return os.path.join(os.path.dirname(os.path.abspath(compilation_cache_directory)), CACHE_FILE)
    return None if workdir is None else os.path.join(workdir, "cache", CACHE_FILE)


MACHINE_CACHE_VARIABLE = "DEW_CACHE_DIR"


def machine_cache_path(environ: Mapping[str, str] | None = None) -> str | None:
    """The machine's own copy of the decisions, shared by every workdir on it (a decision is a
    fact about the CPU, jaxlib and shapes, not about one run): ``CACHE_FILE`` in
    ``$DEW_CACHE_DIR``, else ``$XDG_CACHE_HOME/dew``, else ``~/.cache/dew``. ``DEW_CACHE_DIR=off``
    (or empty) keeps decisions in the workdir only."""
    environ = os.environ if environ is None else environ
    if MACHINE_CACHE_VARIABLE in environ:
        directory = environ[MACHINE_CACHE_VARIABLE]
        return None if directory in ("", "off") else os.path.join(directory, CACHE_FILE)
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dew", CACHE_FILE)


def _remember(path: str | None, part: str, key: str, value: Any, *, quietly: bool = False) -> None:
    """Add one entry (``part``: ``"decisions"`` or ``"shapes"``) to the cache file at ``path``.
    ``quietly``: a file that cannot be written (the machine's copy in a read-only home) only means
    the next workdir measures again, so that error is not the run's."""
    if path is None:
        return
    data = read_cache(path)
    data[part][key] = value
    try:
        write_cache(path, data)
    except OSError:
        if not quietly:
            raise


def run_probe(mode: str, payload: Mapping[str, Any], environment: Mapping[str, str]) -> dict:
    """One measurement child, ``python -m dew.kernel_probe <mode>``: the payload on its stdin,
    its answer the last line of its stdout (JSON). The child's compilation cache is off."""
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
    called in the measurement child with ``args``, returning ``{"batch", "convolutions"}``), and
    ``key``, what the traced classes depend on (the cache's key for them)."""

    function: str
    args: Mapping[str, Any]
    key: Any


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
    environ: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> Decision:
    """The kernel decision for a run, before JAX starts (see the module docstring).

    ``library_setting``/``gradient_setting``: ``config.runtime.cpu_convolutions`` /
    ``cpu_weight_gradient``. ``recorded``: the decision a resumed run recorded (``Decision.record``),
    used for the settings left at ``auto``. ``cache``: the workdir's decisions (beside its
    compilation cache); ``machine_cache``: the machine's (``machine_cache_path``), read when the
    workdir has none and written with every measurement, so a new workdir on a measured machine
    starts no child either. ``XLA_FLAGS`` already choosing the library wins over
    everything for the library. ``runner``: the measurement children (default ``run_probe``).
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
    why = "no convolutions of a measured model to time"  # another model; a reader (dew.sample)
    if environ.get(BY_RULE_VARIABLE) == "1":
        shapes, why = None, f"{BY_RULE_VARIABLE}=1 asks for no measurement"
    if shapes is None:  # the CPU-flag rule
        library = libraries[0]
        if len(libraries) > 1 and cpu_convolutions.eigen_measured_faster():
            library = "eigen"
        if len(gradients) == 1:
            return forced(library, f"config; {why}")
        flags = library_environment(library, environ)["XLA_FLAGS"]
        rule = cpu_convolutions.weight_gradient_choice(xla_flags=flags).per_tap_weight_gradient_from
        return Decision(library, None, f"CPU-flag rule: {why}", rule)

    workdir, machine = read_cache(cache), read_cache(machine_cache)
    data = {part: {**machine[part], **workdir[part]} for part in ("decisions", "shapes")}
    cpu, jaxlib = cpu_model(), jaxlib_version()
    shape_key = _digest({"source": shapes.key, "devices": devices, "jaxlib": jaxlib})
    started = time.perf_counter()
    traced = data["shapes"].get(shape_key)
    if traced is None:
        traced = runner("shapes", {"function": shapes.function, "args": dict(shapes.args)}, environ)
        _remember(cache, "shapes", shape_key, traced)
        _remember(machine_cache, "shapes", shape_key, traced, quietly=True)
    classes = [tuple(int(v) for v in c[:6]) for c in traced["convolutions"]]
    uses = [int(row[6]) for row in traced["convolutions"]]
    counts = {json.dumps(list(c)): n for c, n in zip(classes, uses, strict=True)}
    key = decision_key(cpu, jaxlib, devices, int(traced["batch"]), classes)
    cached = data["decisions"].get(key)
    if cached is None or any(lib not in cached["times"] for lib in libraries):
        times = dict(cached["times"]) if cached else {}
        for library in libraries:
            if library in times:
                continue
            if log is not None:
                log(f"timing {len(classes)} convolution shape classes with {library} (once per machine)")
            payload = {"batch": int(traced["batch"]), "convolutions": [list(c) for c in classes]}
            times[library] = runner("time", payload, library_environment(library, environ))["times"]
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
        _remember(cache, "decisions", key, cached)
        _remember(machine_cache, "decisions", key, cached, quietly=True)
        source = f"measured in {cached['measure_s']:.1f} s"
    elif key in workdir["decisions"]:
        source = f"cached from {cache}"
    else:  # measured on this machine for another workdir: the workdir keeps its own copy too
        _remember(cache, "decisions", key, cached)
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
    "run_probe",
    "set_applied",
]
