"""The CPU kernels a run uses, chosen by timing them on the machine at hand, as
``torch.backends.cudnn.benchmark`` does, instead of by a CPU-flag rule.

Three choices change how fast XLA:CPU trains a convolutional network, never what it computes beyond
float32 reassociation (each choice is one program, bit-for-bit reproducible):

- the convolution library (``config.runtime.cpu_convolutions``): YNNPACK, XLA's default, or
  Eigen (``dew.runtime.cpu_convolutions``);
- where XLA's dots go: XLA's default (YNNPACK) or oneDNN, the library PyTorch runs on Intel CPUs
  (``cpu_convolutions.ONEDNN_DOTS``; XLA hands oneDNN no convolution in jaxlib's builds, see
  there). Both are XLA flags read once, when JAX starts its CPU backend, so each *route* (a
  library, or a library ``+onednn``) is timed in a child process started with its flags;
- the forms of each convolution shape class's two gradients (``config.runtime.cpu_weight_gradient``
  for the weight gradient; ``dew.networks.conv_forms``): XLA's own, or a per-tap or im2col sum of
  matmuls, for the input gradient and the weight gradient each, chosen class by class.

``choose`` makes the decision before this process starts JAX. With ``auto`` it times, for every
shape class the run's network traces (``dew.kernels.record_convolutions``; traced in THIS process
before its backend starts, so the caller's registrations are in effect, by a function named rather
than imported: ``ShapeSource``), in a child process per route given only the shapes (``python -m
dew.kernel_probe time``), the convolution's forward pass and both gradients at the run's batch
over the run's CPU devices, in each form (``kernel_cache.FORMS``: XLA's, then one gradient at a
time per-tap or im2col), and keeps the fastest: the route whose convolutions, each class weighted
by how often the network uses it and taking its fastest forms, cost the step least (``decide``:
the two gradients' forms costed as the sum of their changes from XLA's); then, under that route,
each class's forms. Within ``TIE`` (2 %) the default (YNNPACK, XLA's dots, XLA's gradients) is kept.

A route that does not change a program is not timed as if it did: each child reports a digest of
every compiled program, a ``+onednn`` child is given its library's digests, and a program that
compiles the same (no dot oneDNN took) takes the library's time instead of being timed again. A
route that changes none is not a candidate; the run's ``kernel choice:`` line says so ("…+onednn:
not used by XLA on this CPU"), as it says when XLA_FLAGS or the jaxlib leave no oneDNN route. So
the measurement assumes nothing about the CPU it runs on: on an Intel CPU the same code times
what oneDNN does there.

The decision is cached as JSON (``CACHE_FILE``, in the workdir's ``cache`` folder, and a copy for
the whole machine in ``machine_cache_path``: ``~/.cache/dew``, beside its compiled programs) keyed
by the CPU (``cpu_model``), the jaxlib version, the device count, the batch and the shape classes,
and the traced shape classes by the config sections that shape the network, so a second run of the
same configuration, in the same workdir or a new one, starts no child process. A forced value in
the config overrides the cache; a resumed run uses the choice recorded in its ``run.json``
(``Decision.record``) for every setting left at ``auto``. Nothing is measured unless the backend
will be the CPU: with an accelerator the settings change nothing (``cpu_backend_expected``).

A transformer's run (a ``ShapeSource`` that ``measures`` ``"dots"``) has no convolutions worth
timing: its library and gradients follow the CPU-flag rule, and where its dots go is measured by
``dew.runtime.dot_choice`` (cached beside these decisions).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dew import kernels
from dew.runtime import cpu_convolutions, dot_choice
from dew.runtime.backend import cpu_backend_expected
from dew.runtime.kernel_cache import (
    CACHE_FILE,
    FORMS,
    LIBRARIES,
    MACHINE_CACHE_VARIABLE,
    TIE,
    _remember,
    cache_path,
    digest,
    kept,
    machine_cache_path,
    read_cache,
    stamped,
    valid_decision,
    valid_dot_shapes,
    valid_shapes,
    writable,
    write_cache,
)

LIBRARY_CHOICES = cpu_convolutions.CHOICES  # auto, eigen, ynnpack
WEIGHT_GRADIENT_CHOICES = ("auto", "xla", "per_tap")
#: The timed forms (``kernel_cache.FORMS``) that vary one gradient each, XLA's first (the default).
WEIGHT_FORM_NAMES = ("xla", "per_tap", "weight_im2col")
INPUT_FORM_NAMES = ("xla", "input_per_tap", "input_im2col")
ONEDNN = "+onednn"  # a route's suffix: its dots on oneDNN
PROBE_MODULE = "dew.kernel_probe"

#: ``runner(mode, payload, environment) -> dict``: one measurement child's answer.
Runner = Callable[[str, Mapping[str, Any], Mapping[str, str]], dict]


@dataclasses.dataclass(frozen=True)
class Decision:
    """The convolution library, the shape classes that take the per-tap weight gradient, and
    ``how`` (one line: measured times, cached from a file, forced by config, recorded, rule);
    where measured, ``forms``: every class's (input gradient, weight gradient) forms
    (``dew.networks.conv_forms``) as ``(class, input form, weight form)`` triples, and ``dots``:
    where XLA:CPU's dots go (``xla``: its default; ``onednn``: ``cpu_convolutions.ONEDNN_DOTS``)."""

    library: str
    per_tap: frozenset | None
    how: str
    per_tap_from: int | None = None  # the rule's pixel threshold, where no classes were measured
    forms: frozenset | None = None
    dots: str = "xla"

    def kernel_choice(self) -> kernels.KernelChoice:
        if self.per_tap is None:
            return kernels.KernelChoice(self.per_tap_from, self.how, convolution_forms=self.forms)
        return kernels.KernelChoice(
            None, self.how, per_tap_convolutions=self.per_tap, convolution_forms=self.forms
        )

    def record(self) -> dict:
        """The JSON a run stores with its starts (``run.json``), read back by ``from_record``."""
        per_tap = None if self.per_tap is None else sorted(list(c) for c in self.per_tap)
        forms = None if self.forms is None else sorted([*c, i, w] for c, i, w in self.forms)
        return {
            "library": self.library,
            "per_tap": per_tap,
            "per_tap_from": self.per_tap_from,
            "forms": forms,
            "dots": self.dots,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any], how: str) -> Decision:
        per_tap, forms = record.get("per_tap"), record.get("forms")
        return cls(
            record["library"],
            None if per_tap is None else frozenset(tuple(int(v) for v in c) for c in per_tap),
            how,
            record.get("per_tap_from"),
            None if forms is None else frozenset((tuple(int(v) for v in f[:6]), f[6], f[7]) for f in forms),
            record.get("dots", "xla"),
        )

    def line(self) -> str:
        """What the run prints: the library, the gradients' forms, where dots go, and why."""
        if self.per_tap is None:
            gradient = f"per-tap from {self.per_tap_from} pixels" if self.per_tap_from else "XLA's"
        else:
            gradient = f"per-tap for {len(self.per_tap)} shape class(es)" if self.per_tap else "XLA's"
        inputs = "XLA's"
        if self.forms is not None:
            gradient = _forms_said([w for _, _, w in self.forms]) or gradient
            inputs = _forms_said([i for _, i, _ in self.forms]) or inputs
        dots = ", dots on oneDNN" if self.dots == "onednn" else ""
        return (
            f"convolutions on {self.library}, weight gradients {gradient}, input gradients {inputs}"
            f"{dots} ({self.how})"
        )


def _forms_said(forms: Sequence[str]) -> str:
    """'per-tap for 2, im2col for 1 shape class(es)' for the forms other than XLA's; '' if none."""
    counted = {form: forms.count(form) for form in ("per_tap", "im2col") if form in forms}
    said = ", ".join(f"{form.replace('_', '-')} for {n}" for form, n in counted.items())
    return f"{said} shape class(es)" if said else ""


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


def decision_key(
    cpu: str, jaxlib: str, devices: int, batch: int, convolutions: Sequence[Sequence[int]]
) -> str:
    """The cache key of a measured decision: CPU, jaxlib, device count, batch, shape classes."""
    classes = sorted(list(map(int, c[:6])) for c in convolutions)
    return digest({"cpu": cpu, "jaxlib": jaxlib, "devices": devices, "batch": batch, "classes": classes})


def run_probe(mode: str, payload: Mapping[str, Any], environment: Mapping[str, str]) -> dict:
    """One measurement child, ``python -m dew.kernel_probe <mode>`` (``time``: only convolution
    shapes, nothing the user configured): the payload on its stdin, its answer the last line of
    its stdout (JSON). The child's compilation cache is off. Raises RuntimeError naming the
    child's last line of stderr when it fails, and the program it was compiling (a library that
    aborts the process raises nothing the child could catch)."""
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
        said = done.stderr.strip().splitlines()
        tail = (said or ["(no output)"])[-1]
        doing = [line for line in said if line.startswith("compiling ")]
        where = f", {doing[-1]}" if doing and doing[-1] != tail else ""
        raise RuntimeError(f"the kernel measurement child ({mode}) failed: {tail}{where}")
    return json.loads(lines[-1])


def library_environment(route: str, environ: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with ``XLA_FLAGS`` routing convolutions to ``route``'s library
    and, for a route ending in ``+onednn``, dots to oneDNN (``cpu_convolutions.ONEDNN_DOTS``)."""
    env = dict(environ)
    library, _, dots = route.partition("+")
    if library == "eigen":
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {cpu_convolutions.EIGEN_ROUTE}".strip()
    if dots == "onednn":
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {cpu_convolutions.ONEDNN_DOTS}".strip()
    return env


def decide(
    times: Mapping[str, Mapping[str, Mapping[str, float]]],
    counts: Mapping[str, int],
    libraries: Sequence[str],
    gradients: Sequence[str],
) -> tuple[str, frozenset, dict[str, float], frozenset]:
    """From ``times[route][class][form]`` (seconds of forward + both gradients, ``kernel_cache.FORMS``)
    and ``counts[class]`` (uses in the network; classes as ``json.dumps`` of the 6-tuple): the
    route, the per-tap weight-gradient classes, each route's weighted total and every class's
    ``(class, input form, weight form)``. ``libraries``: the routes to weigh, the default first;
    ``gradients``: the weight-gradient forms allowed (``WEIGHT_FORM_NAMES`` or one of them).

    Per class the weight-gradient form (among ``gradients``) and the input-gradient form (among
    ``INPUT_FORM_NAMES``, those a row has) are each the fastest of the programs that vary only
    that gradient, and their combination is costed as the sum of the two changes from XLA's own
    (``xla`` form): cost = t(weight form) + t(input form) − t(xla). Ties within ``TIE`` go to the
    default (first) candidate."""

    def pick(row: Mapping[str, float], names: Sequence[str]) -> str:
        present = [n for n in names if n in row]
        chosen = present[0]
        for n in present[1:]:
            if row[n] < row[chosen] * (1 - TIE):
                chosen = n
        return chosen

    def best(row: Mapping[str, float]) -> tuple[str, str, float]:
        weight, inputs = pick(row, gradients), pick(row, INPUT_FORM_NAMES)
        cost = row[weight] + row[inputs] - row["xla"]
        # Two gains larger than the whole program (timing noise, or changes that do not add up)
        # would cost it below nothing: the faster of the two measured programs stands for it.
        return weight, inputs, cost if cost > 0 else min(row[weight], row[inputs])

    totals = {lib: sum(counts[c] * best(times[lib][c])[2] for c in counts) for lib in libraries}
    library = libraries[0]
    for lib in libraries[1:]:
        if totals[lib] < totals[library] * (1 - TIE):
            library = lib
    chosen = {c: best(times[library][c]) for c in counts}
    per_tap = frozenset(tuple(json.loads(c)) for c, (w, _, _) in chosen.items() if w == "per_tap")
    forms = frozenset((tuple(json.loads(c)), FORMS[i][0], FORMS[w][1]) for c, (w, i, _) in chosen.items())
    return library, per_tap, totals, forms


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
    measures: str = "convolutions"  # or "dots": a transformer's matrix products (``dot_choice``)

    def trace(self) -> dict:
        """Call ``function`` without starting JAX's backend (see ``_without_backend``)."""
        module, _, name = self.function.partition(":")
        traced = getattr(importlib.import_module(module), name)
        with _without_backend():
            answer = traced(**self.args)
        return valid_dot_shapes(answer) if self.measures == "dots" else valid_shapes(answer)


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
    gradients = WEIGHT_FORM_NAMES if gradient_setting == "auto" else (gradient_setting,)
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
            return Decision(library, forced_gradient, how, forced_from, dots=chosen.dots)
        return dataclasses.replace(chosen, library=library)
    if not cpu_backend_expected(environ):
        return Decision(libraries[0], frozenset(), "not measured: the backend is not the CPU")
    if environ.get(BY_RULE_VARIABLE) == "1":
        return _rule(libraries, gradients, environ, f"{BY_RULE_VARIABLE}=1 asks for no measurement")
    if shapes is None:  # another model; a reader without a run config (dew.sample)
        return _rule(libraries, gradients, environ, "no convolutions of a measured model to time")
    if shapes.measures == "dots":  # a transformer: its convolutions by the rule, its dots measured
        rule = _rule(libraries, gradients, environ, "no convolutions of a measured model to time")
        dots, how = dot_choice.choose_dots(
            shapes,
            cpu=cpu_model(),
            jaxlib=jaxlib_version(),
            devices=devices,
            cache=cache,
            machine_cache=machine_cache,
            runner=runner,
            tracer=tracer,
            environ=environ,
            log=log,
        )
        return dataclasses.replace(rule, how=f"{rule.how}; {how}", dots=dots)

    flags = environ.get("XLA_FLAGS", "")
    routes = list(libraries)
    unavailable = ""
    if cpu_convolutions.onednn_in_flags(flags):
        unavailable = "dots: as XLA_FLAGS says"
    elif not cpu_convolutions.xla_knows_onednn_dots():
        unavailable = "onednn: not in this jaxlib's XLA"
    else:
        routes += [f"{library}{ONEDNN}" for library in libraries]
    needed = set(gradients) | set(INPUT_FORM_NAMES)

    workdir, machine = read_cache(cache, log), read_cache(machine_cache, log)
    data = {part: {**machine[part], **workdir[part]} for part in ("decisions", "shapes")}
    cpu, jaxlib = cpu_model(), jaxlib_version()
    shape_key = digest({"source": shapes.key, "devices": devices, "jaxlib": jaxlib})
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

    def complete(entry: Mapping[str, Any], route: str) -> bool:
        """Whether ``entry`` timed ``route`` in every form needed (or found it unused)."""
        if route in entry.get("unused", {}):
            return True
        rows = entry["times"].get(route)
        return rows is not None and all(needed <= set(rows[c]) for c in counts)

    measured = False
    if cached is None or not all(complete(cached, route) for route in routes):
        try:
            if not checked:
                trace()  # the run's checks, before anything is measured
        except Exception as e:
            return _rule(libraries, gradients, environ, f"not measured, the run's shapes did not trace ({e})")
        if cache is not None and not writable(cache):
            return _rule(libraries, gradients, environ, f"not measured, {cache} cannot be written")
        times = dict(cached["times"]) if cached else {}
        unused = dict(cached.get("unused", {})) if cached else {}
        programs = dict(cached.get("programs", {})) if cached else {}
        try:
            for route in routes:
                if complete({"times": times, "unused": unused}, route):
                    continue
                base = route[: -len(ONEDNN)] if route.endswith(ONEDNN) else None
                if base is not None and any(r.endswith(ONEDNN) for r in unused):
                    unused[route] = unused[next(r for r in unused if r.endswith(ONEDNN))]
                    continue  # where oneDNN took (or compiled) no dot of one library's programs
                if log is not None:
                    log(f"timing {len(classes)} convolution shape classes with {route} (once per machine)")
                payload: dict[str, Any] = {
                    "batch": int(traced["batch"]),
                    "convolutions": [list(c) for c in classes],
                    "forms": sorted(needed),
                }
                if base is not None and base in programs:
                    payload["same_as"] = programs[base]
                try:
                    answer = runner("time", payload, library_environment(route, environ))
                except RuntimeError as e:
                    if base is None:
                        raise
                    unused[route] = f"its measurement child failed ({e})"
                    continue
                rows = {c: dict(r) for c, r in answer["times"].items()}
                same, failed = answer.get("unchanged", []), answer.get("failed", [])
                if failed:  # a run on this route could fail where the child did: not a candidate
                    name, form, error = failed[0]
                    unused[route] = (
                        f"XLA could not compile {len(failed)} of its programs here (first: {name} "
                        f"{form}: {error})"
                    )
                    times.pop(route, None)
                    continue
                if base is not None and len(same) == len(counts) * len(needed):
                    unused[route] = f"not used by XLA on this CPU (the same programs as {base})"
                    times.pop(route, None)
                    continue
                for name, form in same:
                    rows.setdefault(name, {})[form] = times[base][name][form]
                times[route] = rows
                unused.pop(route, None)
                programs[route] = answer.get("programs", {})
            cached = valid_decision({"counts": counts, "times": times, "unused": unused})
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            if log is not None:
                log(f"the kernel measurement failed ({e}): using the CPU-flag rule")
            return _rule(libraries, gradients, environ, "the measurement failed")
        cached = stamped(
            {
                "cpu": cpu,
                "jaxlib": jaxlib,
                "devices": devices,
                "batch": int(traced["batch"]),
                "counts": counts,
                "times": times,
                "unused": unused,
                "programs": programs,
            },
            started,
        )
        measured = True
    source = kept(
        "decisions",
        key,
        cached,
        measured=measured,
        workdir=workdir,
        cache=cache,
        machine_cache=machine_cache,
        log=log,
    )
    unused = cached.get("unused", {})
    timed = [route for route in routes if route not in unused]
    route, per_tap, totals, forms = decide(cached["times"], cached["counts"], timed, gradients)
    library, _, dots = route.partition("+")
    if len(gradients) == 1:
        per_tap, per_tap_from = forced_gradient, forced_from
    else:
        per_tap_from = None
    summary = ", ".join(f"{r} {1e3 * totals[r]:.0f} ms" for r in timed)
    said = [f"{r}: {unused[r]}" for r in routes if r in unused] + ([unavailable] if unavailable else [])
    how = f"{source}: the step's convolutions {summary}" + "".join(f"; {s}" for s in said)
    if len(gradients) == 1:
        how += "; weight gradient forced by config"
    return Decision(library, per_tap, how, per_tap_from, forms, dots or "xla")


__all__ = [
    "BY_RULE_VARIABLE",
    "CACHE_FILE",
    "MACHINE_CACHE_VARIABLE",
    "TIE",
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
