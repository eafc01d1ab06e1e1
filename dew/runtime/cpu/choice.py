"""The kernels a CPU run uses: the convolution library, the convolutions' gradient forms and where
dots go, decided once per process before JAX starts (``choose``).

- the convolution library (``config.runtime.cpu_convolutions``: YNNPACK, XLA's default, or
  Eigen) and the weight gradient (``config.runtime.cpu_weight_gradient``: XLA's or per-tap) are
  forced by the config, kept from a resumed run's ``run.json`` (``Decision.record``, which may
  also name per-class gradient forms, ``dew.networks.conv_forms``), or taken by the CPU-flag rule
  (``dew.runtime.cpu.flags``);
- where a transformer's dots go (XLA's default or oneDNN) is timed on the machine
  (``dew.runtime.cpu.dots``; cached).

Each choice changes speed only, never what is computed beyond float32 reassociation, and each is
one program, bit-for-bit reproducible. Timing every convolution shape class in child processes
(libraries, per-tap and im2col forms) chose what the rule chooses on the CPUs it was compared on,
within noise (``benchmarks/RESULTS.md``), at a first start of 100 s and more, so convolutions are
not timed. Nothing is decided unless the backend will be the CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dew import kernels
from dew.runtime.backend import cpu_backend_expected
from dew.runtime.cpu import dots as dot_choice
from dew.runtime.cpu import flags

LIBRARY_CHOICES = flags.CHOICES  # auto, eigen, ynnpack
WEIGHT_GRADIENT_CHOICES = ("auto", "xla", "per_tap")
#: The convolution libraries ``auto`` chooses between, the default first.
LIBRARIES = ("ynnpack", "eigen")


@dataclasses.dataclass(frozen=True)
class Decision:
    """The convolution library, the shape classes that take the per-tap weight gradient, and
    ``how`` (one line: measured times, cached from a file, forced by config, recorded, rule);
    where measured, ``forms``: every class's (input gradient, weight gradient) forms
    (``dew.networks.conv_forms``) as ``(class, input form, weight form)`` triples, and ``dots``:
    where XLA:CPU's dots go (``xla``: its default; ``onednn``: ``flags.ONEDNN_DOTS``)."""

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


#: Set to 1, ``auto`` settings take the CPU-flag rule (``dew.runtime.cpu.flags``) instead
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
    features = hashlib.sha256(fields.get("flags", fields.get("Features", "")).encode()).hexdigest()[:8]
    return (
        f"{fields.get('model name', 'unknown')} (family {fields.get('cpu family', '?')}, model "
        f"{fields.get('model', '?')}, {os.cpu_count()} cores, flags {features})"
    )


def jaxlib_version() -> str:
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _rule(
    libraries: Sequence[str], gradients: Sequence[str], environ: Mapping[str, str], why: str
) -> Decision:
    """The CPU-flag rule (``dew.runtime.cpu.flags``), said with ``why`` nothing was measured."""
    library = libraries[0]
    if len(libraries) > 1 and flags.eigen_measured_faster():
        library = "eigen"
    if len(gradients) == 1:
        forced_gradient = frozenset() if gradients[0] == "xla" else None
        return Decision(library, forced_gradient, f"config; {why}", 1 if gradients[0] == "per_tap" else None)
    given = environ.get("XLA_FLAGS", "")
    routed = f"{given} {flags.EIGEN_ROUTE}".strip() if library == "eigen" else given
    rule = flags.weight_gradient_choice(xla_flags=routed).per_tap_weight_gradient_from
    return Decision(library, None, f"CPU-flag rule: {why}", rule)


def choose(
    library_setting: str,
    gradient_setting: str,
    *,
    shapes: dot_choice.ShapeSource | None,
    devices: int,
    cache: str | None,
    machine_cache: str | None = None,
    recorded: Mapping[str, Any] | None = None,
    recorded_in: str = "run.json",
    runner: dot_choice.Runner | None = None,
    tracer: Callable[[dot_choice.ShapeSource], dict] | None = None,
    environ: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> Decision:
    """The kernel decision for a run, before JAX starts (see the module docstring).

    ``library_setting``/``gradient_setting``: ``config.runtime.cpu_convolutions`` /
    ``cpu_weight_gradient``; ``XLA_FLAGS`` already choosing the library wins for the library.
    ``recorded``: the decision a resumed run recorded (``Decision.record``), used for the settings
    left at ``auto``. ``shapes``: a transformer's matrix products (``dots.ShapeSource``), whose
    route is measured (``dots.choose_dots``, with ``cache`` (the workdir's, None without one),
    ``machine_cache``, ``runner``, ``tracer`` and ``log``: see there); None: the CPU-flag rule.
    ``BY_RULE_VARIABLE`` set to 1 measures nothing. Raises ValueError for an unknown setting."""
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
    runner = dot_choice.run_probe if runner is None else runner
    tracer = dot_choice.ShapeSource.trace if tracer is None else tracer
    environ = dict(os.environ if environ is None else environ)
    flagged = flags.library_in_flags(environ.get("XLA_FLAGS", ""))
    libraries = (flagged,) if flagged else (LIBRARIES if library_setting == "auto" else (library_setting,))
    if "eigen" in libraries and not flagged and not flags.xla_knows_the_flag():
        if library_setting == "eigen":
            raise ValueError(
                "config.runtime.cpu_convolutions='eigen': this jaxlib's XLA has no "
                f"{flags.FLAG} flag; use 'auto' or 'ynnpack'"
            )
        libraries = ("ynnpack",)
    gradients = ("xla", "per_tap") if gradient_setting == "auto" else (gradient_setting,)
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
    rule = _rule(libraries, gradients, environ, "convolutions are not timed")
    if shapes is None:  # not a transformer; a reader without a run config (dew.sample)
        return rule
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


__all__ = [
    "BY_RULE_VARIABLE",
    "LIBRARIES",
    "Decision",
    "choose",
    "cpu_model",
    "jaxlib_version",
]
