"""The kernels a CPU run uses: the convolution library and the convolutions' gradient forms,
decided once per process before JAX starts (``choose``).

The convolution library (``config.runtime.cpu_convolutions``: YNNPACK, XLA's default, or Eigen)
and the weight gradient (``config.runtime.cpu_weight_gradient``: XLA's or per-tap) are forced by
the config, kept from a resumed run's ``run.json`` (``Decision.record``, which may also name
per-class gradient forms, ``dew.networks.conv_forms``), or taken by the CPU-flag rule
(``dew.runtime.cpu.flags``). Each changes speed only, never what is computed beyond float32
reassociation, and each is one program, bit-for-bit reproducible. Nothing is timed: timing every
convolution shape class in child processes chose what the rule chooses on the CPUs it was
compared on, within noise, at a first start of 100 s and more, and handing a transformer's dots
to oneDNN where a child timed it faster aborted the run's own program on an AVX-512 CPU
(``benchmarks/RESULTS.md``). Dots are XLA's always; a ``run.json`` that recorded oneDNN's is
read, said in one line and not followed. Nothing is decided unless the backend will be the CPU.
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
from dew.runtime.cpu import flags

LIBRARY_CHOICES = flags.CHOICES  # auto, eigen, ynnpack
WEIGHT_GRADIENT_CHOICES = ("auto", "xla", "per_tap")
#: The convolution libraries ``auto`` chooses between, the default first.
LIBRARIES = ("ynnpack", "eigen")
#: A convolution gradient's forms (``dew.networks.conv_forms``), as a run records them.
FORMS = ("xla", "per_tap", "im2col")


def _shape_class(value: Any) -> bool:
    """Whether ``value`` is a convolution shape class as recorded: a list of 6 ints >= 0."""
    return isinstance(value, list) and len(value) == 6 and all(type(v) is int and v >= 0 for v in value)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The convolution library, the shape classes that take the per-tap weight gradient (None:
    by pixel count, ``per_tap_from``) and ``how`` (one line: forced by config, recorded, rule);
    where a run recorded them, ``forms``: every class's (input gradient, weight gradient) forms
    (``dew.networks.conv_forms``) as ``(class, input form, weight form)`` triples."""

    library: str
    per_tap: frozenset | None
    how: str
    per_tap_from: int | None = None  # the rule's pixel threshold, where no classes were named
    forms: frozenset | None = None

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
        }

    @classmethod
    def from_record(cls, record: Any, how: str) -> Decision:
        """A recorded decision (``record``: what ``record`` wrote, read from a run's file: any
        JSON); a ``dots`` entry (runs before dots were XLA's always) is not read. Raises
        ValueError saying what is malformed."""
        if not isinstance(record, dict) or record.get("library") not in LIBRARIES:
            raise ValueError(
                f"'kernels' is {record!r:.80}, expected an object whose library is one of {LIBRARIES}"
            )
        per_tap, per_tap_from, forms = record.get("per_tap"), record.get("per_tap_from"), record.get("forms")
        if per_tap is not None and not (isinstance(per_tap, list) and all(_shape_class(c) for c in per_tap)):
            raise ValueError(
                f"'kernels.per_tap' is {per_tap!r:.80}, expected a list of shape classes (6 ints)"
            )
        if per_tap_from is not None and not (type(per_tap_from) is int and per_tap_from >= 1):
            raise ValueError(f"'kernels.per_tap_from' is {per_tap_from!r:.80}, expected an int >= 1")
        if forms is not None and not (
            isinstance(forms, list)
            and all(
                isinstance(f, list)
                and len(f) == 8
                and _shape_class(f[:6])
                and f[6] in FORMS
                and f[7] in FORMS
                for f in forms
            )
        ):
            raise ValueError(
                f"'kernels.forms' is {forms!r:.80}, expected [6 ints, input form, weight form] rows"
            )
        return cls(
            record["library"],
            None if per_tap is None else frozenset(tuple(c) for c in per_tap),
            how,
            per_tap_from,
            None if forms is None else frozenset((tuple(f[:6]), f[6], f[7]) for f in forms),
        )

    def line(self) -> str:
        """What the run prints: the library, the gradients' forms, and why."""
        if self.per_tap is None:
            gradient = f"per-tap from {self.per_tap_from} pixels" if self.per_tap_from else "XLA's"
        else:
            gradient = f"per-tap for {len(self.per_tap)} shape class(es)" if self.per_tap else "XLA's"
        inputs = "XLA's"
        if self.forms is not None:
            gradient = _forms_said([w for _, _, w in self.forms]) or gradient
            inputs = _forms_said([i for _, i, _ in self.forms]) or inputs
        said = f"convolutions on {self.library}, weight gradients {gradient}, input gradients {inputs}"
        return f"{said} ({self.how})"


def _forms_said(forms: Sequence[str]) -> str:
    """'per-tap for 2, im2col for 1 shape class(es)' for the forms other than XLA's; '' if none."""
    counted = {form: forms.count(form) for form in ("per_tap", "im2col") if form in forms}
    said = ", ".join(f"{form.replace('_', '-')} for {n}" for form, n in counted.items())
    return f"{said} shape class(es)" if said else ""


def cpu_model() -> str:
    """The CPU as a run records it: /proc/cpuinfo's model name, family and model, the core count
    and a digest of the feature flags (VMs may name different CPUs alike, 'AMD EPYC')."""
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


#: The one line a resumed run whose ``run.json`` recorded oneDNN's dots prints.
ONEDNN_RECORDED = (
    "{where} recorded XLA's dots on oneDNN: this run keeps XLA's own (oneDNN's aborted a run's "
    "program on an AVX-512 CPU; docs/cpu.md)"
)


def choose(
    library_setting: str,
    gradient_setting: str,
    *,
    recorded: Mapping[str, Any] | None = None,
    recorded_in: str = "run.json",
    environ: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> Decision:
    """The kernel decision for a run, before JAX starts (see the module docstring).

    ``library_setting``/``gradient_setting``: ``config.runtime.cpu_convolutions`` /
    ``cpu_weight_gradient``; ``XLA_FLAGS`` already choosing the library wins for the library.
    ``recorded``: the decision a resumed run recorded (``Decision.record``, from ``recorded_in``),
    used for the settings left at ``auto``; where it names oneDNN's dots, ``log`` says once that
    they are not used. Otherwise the CPU-flag rule. Raises ValueError for an unknown setting,
    ``eigen`` on an XLA without its flag, or a malformed ``recorded`` (naming ``recorded_in``)."""
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
    environ = dict(os.environ if environ is None else environ)
    given = environ.get("XLA_FLAGS", "")
    flagged = flags.library_in_flags(given)
    libraries = (flagged,) if flagged else (LIBRARIES if library_setting == "auto" else (library_setting,))
    if "eigen" in libraries and not flagged and not flags.xla_knows_the_flag():
        if library_setting == "eigen":
            raise ValueError(
                "config.runtime.cpu_convolutions='eigen': this jaxlib's XLA has no "
                f"{flags.FLAG} flag; use 'auto' or 'ynnpack'"
            )
        libraries = ("ynnpack",)
    forced_gradient = {"xla": frozenset(), "per_tap": None, "auto": None}[gradient_setting]
    forced_from = 1 if gradient_setting == "per_tap" else None  # every convolution
    if len(libraries) == 1 and gradient_setting != "auto":
        how = "XLA_FLAGS and config" if flagged else "forced by config"
        return Decision(libraries[0], forced_gradient, how, forced_from)
    if recorded is not None:
        if isinstance(recorded, dict) and recorded.get("dots") == "onednn" and log is not None:
            log(ONEDNN_RECORDED.format(where=recorded_in))
        try:
            chosen = Decision.from_record(recorded, f"recorded with the run's checkpoints in {recorded_in}")
        except ValueError as e:
            raise ValueError(
                f"{recorded_in} is malformed: {e}; move it aside to start the run's history anew"
            ) from None
        library = chosen.library if len(libraries) > 1 else libraries[0]
        if gradient_setting != "auto":
            how = chosen.how + ", weight gradient forced by config"
            return Decision(library, forced_gradient, how, forced_from)
        return dataclasses.replace(chosen, library=library)
    if not cpu_backend_expected(environ):
        return Decision(libraries[0], frozenset(), "none chosen: the backend is not the CPU")
    library = libraries[0]
    if len(libraries) > 1 and flags.eigen_measured_faster():
        library = "eigen"
    if gradient_setting != "auto":
        how = "weight gradient forced by config, library by the CPU-flag rule"
        return Decision(library, forced_gradient, how, forced_from)
    routed = f"{given} {flags.EIGEN_ROUTE}".strip() if library == "eigen" else given
    rule = flags.weight_gradient_choice(xla_flags=routed).per_tap_weight_gradient_from
    return Decision(library, None, "CPU-flag rule", rule)


__all__ = ["LIBRARIES", "ONEDNN_RECORDED", "Decision", "choose", "cpu_model", "jaxlib_version"]
