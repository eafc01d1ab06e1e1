"""``start``: the one call that sets up the process for a run, before JAX starts its backend.

``python -m dew.main``, ``python -m dew.sample`` and a user's own script make it alike::

    from dew.runtime import start
    platform = start(config, workdir)   # before anything touches a device
    trainer = Trainer(config, workdir)

It presents the CPU host's devices (``host_devices``), chooses XLA:CPU's convolution library and
the convolutions' weight gradients by timing them on this machine (``kernel_choice``; cached),
routes the library (``cpu_convolutions``), hands the kernel choice to the layers
(``dew.kernels``) and turns on the persistent compilation cache (``compilation_cache``), each
from ``config.runtime``; launched as one of several processes (flags, ``DEW_*`` variables or a
cluster JAX detects: ``distributed``), it first starts JAX's distributed runtime.
On an accelerator the CPU settings change nothing. Called after the backend has started, it
changes no device setting (XLA read its flags already) and says so in ``Platform.lines``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

from dew import kernels
from dew.runtime import (
    backend,
    compilation_cache,
    cpu_convolutions,
    distributed,
    host_devices,
    host_memory,
    kernel_choice,
)
from dew.schema import ConfigError, Key, Section, at_least

CONFIG = Section(
    "the process and its platform, set up by dew.runtime.platform before JAX starts",
    {
        "host_devices": Key(
            0,
            "CPU devices XLA presents (0: one per core, as many as the batch sizes divide; XLA_FLAGS "
            "naming a count wins; accelerators are unaffected)",
            **at_least(0, "an int >= 0 (0: one per CPU core)"),
        ),
        "cpu_convolutions": Key(
            "auto",
            "XLA:CPU's convolution library: 'eigen', 'ynnpack' (XLA's default) or 'auto' (the faster "
            "for this run's convolutions, timed once on this machine and cached; a resumed run keeps "
            "the one it recorded; dew.runtime.kernel_choice). XLA_FLAGS setting it wins",
            choices=kernel_choice.LIBRARY_CHOICES,
        ),
        "cpu_weight_gradient": Key(
            "auto",
            "convolution weight gradients on the CPU: 'xla', 'per_tap' (a sum over kernel taps, every "
            "convolution) or 'auto' (per shape class, the faster one, timed with the library; "
            "dew.runtime.kernel_choice)",
            choices=kernel_choice.WEIGHT_GRADIENT_CHOICES,
        ),
        "reuse_freed_memory": Key(
            True,
            "glibc keeps the memory a CPU step frees for the next step (one heap for every thread, "
            "large blocks on it), so XLA:CPU's per-step buffers are not faulted in anew each step; "
            "the process keeps its peak heap. Not where the process started with glibc's huge pages "
            "(python -m dew.main), which are faster there. False: glibc's defaults "
            "(dew.runtime.host_memory)",
        ),
        "attention": Key(
            "auto",
            "how transformers compute attention: 'xla' (jax.nn.dot_product_attention's XLA path), "
            "'flash' (the TPU's Pallas flash kernel for sequences of whole 128-token blocks; a TPU "
            "only) or 'auto' (XLA's: on a TPU v5e SiT-B/2's bf16 step took 109 ms with it, 166 ms "
            "with flash; dew.kernels.attention)",
            choices=("auto", "xla", "flash"),
        ),
        "compilation_cache": Key(
            "",
            "directory of JAX's persistent compilation cache ('': the machine's, shared by every "
            "workdir: ~/.cache/dew/jax, moved by DEW_CACHE_DIR, <workdir>/cache/jax with "
            "DEW_CACHE_DIR=off; 'off': none; JAX_COMPILATION_CACHE_DIR wins; "
            "dew.runtime.compilation_cache)",
        ),
        "coordinator_timeout": Key(
            300,
            "seconds a process of a multi-process run waits for the coordinator (process 0) to "
            "answer before it stops, naming the address (dew.runtime.distributed)",
            **at_least(1, "an int >= 1 (seconds)"),
        ),
        "heartbeat_timeout": Key(
            100,
            "seconds without a heartbeat after which a process of a multi-process run counts as dead "
            "and the others stop with an error instead of waiting for it",
            **at_least(1, "an int >= 1 (seconds)"),
        ),
    },
)


_DEFAULTS = {name: key.default for name, key in CONFIG.keys.items() if isinstance(key, Key)}


@dataclasses.dataclass(frozen=True)
class Platform:
    """What ``start`` set up: the CPU devices it presented (None: left as they were), XLA:CPU's
    convolution library, the kernel choice the layers receive, the compilation cache directory
    (None: off), the process group this process joined (None: a single-process run)."""

    host_devices: int | None
    convolutions: str
    kernels: kernels.KernelChoice
    compilation_cache: str | None
    processes: distributed.ProcessGroup | None = None
    decision: kernel_choice.Decision | None = None
    reuses_freed_memory: bool = False
    cpu: bool = True

    def kernels_record(self) -> dict | None:
        """The kernel decision this process runs with, as the run's ``run.json`` records it (what
        a resume keeps: ``kernel_choice.applied_record``); None when ``start`` made none."""
        return kernel_choice.applied_record()

    def lines(self, data_parallel: int | None = None) -> list[str]:
        """One line per choice, for a run's log (``data_parallel``: the devices each batch is
        split over): on the CPU every CPU choice; on an accelerator the devices and where compiled
        programs are kept (``backend.describe_devices`` starts the backend)."""
        out = []
        if self.processes is not None:
            group = self.processes
            out.append(
                f"process {group.process_id} of {group.num_processes} (coordinator {group.coordinator}, "
                f"from {group.origin})"
            )
        if not self.cpu:
            cache = self.compilation_cache or "off (config.runtime.compilation_cache)"
            return [*out, backend.describe_devices(), f"compiled programs are kept in {cache}"]
        if data_parallel and data_parallel > 1:
            out.append(f"each batch is split over {data_parallel} CPU devices (config.runtime.host_devices)")
        out.append(f"XLA:CPU runs convolutions with {self.convolutions} (config.runtime.cpu_convolutions)")
        if self.reuses_freed_memory:
            out.append("glibc keeps what a step frees for the next one (config.runtime.reuse_freed_memory)")
        if self.decision is not None:
            out.append(f"kernel choice: {self.decision.line()}")
        else:
            out.append(f"convolution weight gradients: {self.kernels.reason}")
        return out


def _batch_sizes(config: Any) -> list[int]:
    sizes = []
    if "dataset" in config and config.dataset.get("batch_size"):
        sizes.append(config.dataset.batch_size)
    if "eval" in config and config.eval.get("batch_size") is not None:
        sizes.append(config.eval.batch_size)
    return sizes


#: Models built from ``dew.networks.edm_layers``, whose convolutions report their shape classes
#: (``dew.kernels.record_convolutions``), so their kernels can be measured. Other models keep the
#: CPU-flag rule (``dew.runtime.cpu_convolutions``).
MEASURED_MODELS = ("songunet", "dhariwalunet")
#: The transformers (``dew.networks.dit``'s registered names) whose matrix products are measured
#: instead: where XLA:CPU's dots go (``dew.runtime.dot_choice``).
DOT_MEASURED_MODELS = ("dit", "sit", "imf_dit")
DOT_MEASURED_PREFIXES = ("DiT-", "SiT-", "iMF-")
#: The config sections that shape a run's convolutions (the key of its traced shape classes).
SHAPING_SECTIONS = ("dataset", "model", "objective", "mesh")


def run_shapes(config: Any, devices: int) -> kernel_choice.ShapeSource | None:
    """Where ``choose`` finds a run's convolution shape classes: traced from its config, in this
    process and before JAX starts, by ``dew.kernel_probe.trainer_convolutions`` (the caller's
    registrations in effect), over the ``devices`` the run will have; None for a model that is not
    one of ``MEASURED_MODELS`` or no run config. For a transformer (``DOT_MEASURED_MODELS``, the
    names starting ``DOT_MEASURED_PREFIXES``) its matrix products instead
    (``dew.kernel_probe.trainer_dots``, measured by ``dew.runtime.dot_choice``)."""
    if config is None or "model" not in config:
        return None
    name = str(config.model.get("name"))
    dots = name in DOT_MEASURED_MODELS or name.startswith(DOT_MEASURED_PREFIXES)
    if name not in MEASURED_MODELS and not dots:
        return None
    as_dict = json.loads(json.dumps(config.to_dict(), default=str))
    key = {section: as_dict.get(section) for section in SHAPING_SECTIONS}
    key["accumulation"] = as_dict.get("train", {}).get("accumulation")
    key["eval_batch"] = as_dict.get("eval", {}).get("batch_size")
    function = "dew.kernel_probe:trainer_dots" if dots else "dew.kernel_probe:trainer_convolutions"
    arguments = {"config": config, "devices": devices}
    return kernel_choice.ShapeSource(function, arguments, key, "dots" if dots else "convolutions")


def attention_choice(setting: str, environ: Mapping[str, str] | None = None) -> str:
    """``KernelChoice.attention`` for ``config.runtime.attention``: the TPU's flash kernel when
    asked (``flash``), XLA's otherwise (``auto``: measured faster for the DiT family's 256-token
    sequences on a TPU v5e, benchmarks/RESULTS.md); ``flash`` where no TPU is expected is a
    ValueError naming the key."""
    platform_name = backend.expected_platform(environ)
    if setting == "flash" and platform_name != "tpu":
        raise ValueError(
            "config.runtime.attention='flash' is invalid here: the flash kernel runs on a TPU and "
            f"this process's backend will be {platform_name!r}; expected 'auto' or 'xla'"
        )
    return "tpu_flash" if setting == "flash" else "xla"


_started: Platform | None = None


def started() -> Platform | None:
    """What ``start`` set up in this process (None: it was not called)."""
    return _started


class PlatformNotApplied(UserWarning):
    """A Trainer, pipeline or evaluation was built after JAX started its backend without
    ``dew.runtime.start``: the process keeps XLA's defaults (``start_for``)."""


def start_for(
    what: str,
    config: Any = None,
    workdir: str | None = None,
    *,
    say: bool = True,
    warn: bool = True,
    **options: Any,
) -> Platform | None:
    """What a ``Trainer``, ``pipeline`` or ``evaluate`` built in a user's own code calls first:
    ``start(config, workdir, **options)`` when nobody has and JAX has not started its backend (the
    same decision, caches and ``kernel choice:`` line as ``python -m dew.main``; the lines are
    printed when ``say``, as that command prints them); nothing when ``start`` was called; where
    JAX started first, one ``PlatformNotApplied`` warning (once per caller, Python's default
    filter) saying what was missed and how to get it, unless not ``warn`` (a reader such as
    ``dew.pipeline``, inside commands that touch JAX first: it misses only the convolution
    library's rule and the compilation cache). ``what`` names the caller. A setting this
    machine cannot honour is a ``ConfigError`` naming the key."""
    if _started is not None:
        return None
    if host_devices.backend_started():
        if not warn:
            return None
        warnings.warn(
            f"{what} built after JAX started, without dew.runtime.start: this process keeps XLA's "
            "default devices and kernels (not one CPU device per core, not the measured convolution "
            "kernels); call dew.runtime.start(config, workdir) before anything touches a device, as "
            "python -m dew.main does",
            PlatformNotApplied,
            stacklevel=3,
        )
        return None
    try:
        platform = start(config, workdir, **options)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if say and platform.cpu:
        for line in platform.lines():
            print(f"dew: {line}", flush=True)
    return platform


def start(
    config: Any = None,
    workdir: str | None = None,
    *,
    present_devices: bool = True,
    processes: distributed.ProcessGroup | None = None,
    detect_processes: bool = True,
    shapes: kernel_choice.ShapeSource | None = None,
    recorded: dict | None = None,
    recorded_in: str = "run.json",
) -> Platform:
    """Set up this process from a resolved run config's ``runtime`` section (None: its defaults) and return
    what was chosen. ``workdir`` holds the kernel choice's own copy (without one, the machine's
    cache serves; the compilation cache is the machine's by default: ``compilation_cache``);
    ``present_devices=False`` leaves the CPU device count as it is (a reader that samples on one
    device, as ``python -m dew.sample`` does). ``processes``: the process group to join (``python -m
    dew.main``'s flags); None reads it from the environment or a cluster JAX detects, unless
    ``detect_processes=False`` (``distributed.requested``). ``shapes``: where the run's convolution
    shapes come from (default: ``run_shapes``); ``recorded``: the kernel decision a resumed run
    recorded (``run.json``'s ``kernels``), kept for settings left at ``auto``. In a process group
    (also one the caller joined with ``jax.distributed.initialize``) nothing is measured (each
    process would time its own machine and might choose differently): the recorded decision, a
    forced one, or the CPU-flag rule. Raises ValueError for a setting this machine cannot honour
    (e.g. ``cpu_convolutions='eigen'`` on an XLA without the flag), naming the key;
    ``distributed.ProcessGroupError`` (a ValueError) for a process group that cannot be formed, and
    ``ConfigError`` for ``config.mesh.devices`` that the process count does not divide, before any
    peer is waited for."""
    section = config.runtime if config is not None and "runtime" in config else _DEFAULTS
    on_cpu = backend.cpu_backend_expected()
    if processes is None and detect_processes:
        processes = distributed.requested(initialization_timeout=section["coordinator_timeout"])
    if processes is not None and processes.num_processes > 1:
        if config is not None and "mesh" in config:
            distributed.check_devices(config.mesh.devices, processes.num_processes)
        distributed.start_processes(processes, section["coordinator_timeout"], section["heartbeat_timeout"])
    else:
        processes = None
    presented = None
    if present_devices and on_cpu:
        count_of = processes.num_processes if processes is not None else 1
        local = [size // count_of for size in _batch_sizes(config or {}) if size % count_of == 0]
        count = host_devices.host_device_count(section["host_devices"], local)
        presented = host_devices.present_host_devices(count)
    global _started
    directory = compilation_cache.cache_directory(section["compilation_cache"], workdir)
    decision = None
    reuses = False
    attention = attention_choice(str(section.get("attention", "auto")))
    if not on_cpu:  # an accelerator: none of the CPU's kernel choices, memory tuning or devices
        convolutions = "the accelerator's own (no CPU kernel choice)"
        choice = kernels.KernelChoice(
            reason="the accelerator's kernels (no CPU kernel choice)", attention=attention
        )
    elif host_devices.backend_started():  # XLA read its flags already: nothing can change now
        convolutions = cpu_convolutions.route_convolutions(section["cpu_convolutions"])
        choice = cpu_convolutions.weight_gradient_choice()
    else:
        # Before XLA's threads exist: each takes its malloc arena when it first allocates.
        reuses = bool(section.get("reuse_freed_memory", True)) and host_memory.reuse_freed_memory()
        devices = host_devices.flagged_count(os.environ.get("XLA_FLAGS", "")) or 1
        import jax  # no backend: whether the user's code joined a process group itself

        grouped = processes is not None or jax.distributed.is_initialized()
        decision = kernel_choice.choose(
            section["cpu_convolutions"],
            section.get("cpu_weight_gradient", "auto"),
            shapes=None if grouped else shapes or run_shapes(config, devices),
            devices=devices,
            cache=kernel_choice.cache_path(workdir),
            machine_cache=kernel_choice.machine_cache_path(),
            recorded=recorded,
            recorded_in=recorded_in,
            log=lambda line: print(f"dew: {line}", flush=True),
        )
        convolutions = cpu_convolutions.route_convolutions(decision.library)
        if cpu_convolutions.route_dots(decision.dots) == "onednn":
            # XLA cannot store oneDNN's fusions in the compilation cache; the kernel choice's line
            # says so once (``dot_choice.NOT_CACHED``) instead of a warning for every program.
            unstorable = r"Error writing persistent compilation cache entry .*onednn"
            warnings.filterwarnings("ignore", message=unstorable, category=UserWarning)
        choice = decision.kernel_choice()
    kernels.set_choice(choice)
    kernel_choice.set_applied(decision)
    if directory is not None:
        compilation_cache.enable_compilation_cache(directory)
    _started = Platform(presented, convolutions, choice, directory, processes, decision, reuses, on_cpu)
    return _started


__all__ = ["CONFIG", "Platform", "PlatformNotApplied", "start", "start_for", "started"]
