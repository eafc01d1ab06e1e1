"""``start``: the one call that sets up the process for a run, before JAX starts its backend.

``python -m dew.main``, ``python -m dew.sample`` and a user's own script make it alike::

    from dew.runtime import start
    platform = start(config, workdir)   # before anything touches a device
    trainer = Trainer(config, workdir)

Launched as one of several processes (flags, ``DEW_*`` variables or a cluster JAX detects:
``distributed``), it first joins the process group. Then it picks what the devices need: where
the backend will be the CPU (``backend.cpu_backend_expected``, known before JAX starts), the CPU
platform (``dew.runtime.cpu.setup.set_up``: devices, memory, kernels); on an accelerator, its
own kernels and the attention asked for. Both hand the kernel choice to the layers
(``dew.kernels``) and turn on the persistent compilation cache (``compilation_cache``), each
from ``config.runtime``. Called after the backend has started, it changes no device setting
(XLA read its flags already) and says so in ``Platform.lines``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dew import kernels
from dew.runtime import backend, compilation_cache, distributed
from dew.schema import ConfigError, Key, Section, at_least

if TYPE_CHECKING:
    from dew.runtime.cpu.choice import Decision

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
            "XLA:CPU's convolution library: 'eigen', 'ynnpack' (XLA's default) or 'auto' (Eigen on x86 "
            "CPUs with AVX2 and without AVX-512, where it was measured faster, else YNNPACK; a resumed "
            "run keeps the one it recorded; dew.runtime.cpu.flags). XLA_FLAGS setting it wins",
            choices=("auto", "eigen", "ynnpack"),
        ),
        "cpu_weight_gradient": Key(
            "auto",
            "convolution weight gradients on the CPU: 'xla', 'per_tap' (a sum over kernel taps, every "
            "convolution) or 'auto' (per-tap from 32×32 pixels where YNNPACK's is slow, x86 without "
            "AVX-512, else XLA's; a resumed run keeps what it recorded; dew.runtime.cpu.flags)",
            choices=("auto", "xla", "per_tap"),
        ),
        "reuse_freed_memory": Key(
            True,
            "glibc keeps the memory a CPU step frees for the next step (one heap for every thread, "
            "large blocks on it), so XLA:CPU's per-step buffers are not faulted in anew each step; "
            "the process keeps its peak heap. Set with mallopt in a user's running process; python "
            "-m dew.main starts with the same settings as glibc tunables instead (opt out: "
            "GLIBC_TUNABLES=glibc.malloc.arena_max=0). False: glibc's defaults in a user's process "
            "(dew.runtime.cpu.memory)",
        ),
        "attention": Key(
            "auto",
            "how transformers compute attention: 'xla' (XLA's, the logits and probabilities in "
            "memory in the inputs' dtype, the softmax's arithmetic in float32), 'xla_float32_logits' "
            "(jax.nn.dot_product_attention's XLA path: float32 logits for bf16 inputs too), 'flash' "
            "(the TPU's Pallas flash kernel for sequences of whole 128-token blocks; a TPU only) or "
            "'auto' ('xla': on a TPU v5e SiT-B/2's bf16 step took 88.7 ms with it, 109.2 ms with "
            "float32 logits, 166 ms with flash; dew.kernels.attention)",
            choices=("auto", "xla", "xla_float32_logits", "flash"),
        ),
        "fresh_state": Key(
            "auto",
            "where the state of step 0 is built: 'host' (the init program on the host's CPU, then "
            "placed on the devices), 'devices' (on the devices, each its shards) or 'auto' (the host "
            "where the devices are accelerators, the run is one process and no step compiles beside "
            "it, as in a custom loop's initial_state(): on a TPU v5e SiT-B/2's init compiled in 45 s "
            "for the chip, 8 s built on the host; dew.training.host_init)",
            choices=("auto", "host", "devices"),
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
    decision: Decision | None = None
    freed_memory: str | None = None
    cpu: bool = True

    def kernels_record(self) -> dict[str, Any] | None:
        """The kernel decision this process runs with, as the run's ``run.json`` records it (what
        a resume keeps: ``Decision.record`` with how it was made, the CPU and jaxlib); None when
        ``start`` made none."""
        from dew.runtime.cpu.setup import applied_record

        return applied_record() if self.cpu else None

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
        if self.freed_memory is not None:
            out.append(f"glibc keeps what a step frees for the next one ({self.freed_memory})")
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


def attention_choice(setting: str, environ: Mapping[str, str] | None = None) -> str:
    """``KernelChoice.attention`` for ``config.runtime.attention``: the TPU's flash kernel when
    asked (``flash``), XLA's with float32 logits when asked (``xla_float32_logits``), XLA's with
    the logits in the inputs' dtype otherwise (``auto``: measured fastest for the DiT family's
    256-token sequences on a TPU v5e, benchmarks/RESULTS.md); ``flash`` where no TPU is expected
    is a ValueError naming the key."""
    platform_name = backend.expected_platform(environ)
    if setting == "flash" and platform_name != "tpu":
        raise ValueError(
            "config.runtime.attention='flash' is invalid here: the flash kernel runs on a TPU and "
            f"this process's backend will be {platform_name!r}; expected 'auto' or 'xla'"
        )
    if setting == "flash":
        return "tpu_flash"
    return "xla_float32_logits" if setting == "xla_float32_logits" else "xla"


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
    stacklevel: int = 3,
    **options: Any,
) -> Platform | None:
    """What a ``Trainer``, ``pipeline`` or ``evaluate`` built in a user's own code calls first:
    ``start(config, workdir, **options)`` when nobody has and JAX has not started its backend (the
    same decision, caches and ``kernel choice:`` line as ``python -m dew.main``; the lines are
    printed when ``say``, as that command prints them); nothing when ``start`` was called; where
    JAX started first, one ``PlatformNotApplied`` warning (once per caller, Python's default
    filter) saying what was missed and how to get it, unless not ``warn`` (a reader such as
    ``dew.pipeline``, inside commands that touch JAX first: it misses only the convolution
    library's rule and the compilation cache). ``what`` names the caller; the warning points at
    the frame ``stacklevel`` (``warnings.warn``'s: 3 is the caller of ``start_for``'s caller). A setting this
    machine cannot honour is a ``ConfigError`` naming the key."""
    if _started is not None:
        return None
    if backend.backend_started():
        if not warn:
            return None
        warnings.warn(
            f"{what} built after JAX started, without dew.runtime.start: this process keeps XLA's "
            "default devices and kernels (not one CPU device per core, not the CPU-flag rule's convolution "
            "kernels); call dew.runtime.start(config, workdir) before anything touches a device, as "
            "python -m dew.main does",
            PlatformNotApplied,
            stacklevel=stacklevel,
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
    group_flags: tuple[str | None, str | None, str | None] = (None, None, None),
    recorded: dict[str, Any] | None = None,
    recorded_in: str = "run.json",
) -> Platform:
    """Set up this process from a resolved run config's ``runtime`` section (None: its defaults) and
    return what was chosen. ``workdir``: where the compilation cache goes with
    ``DEW_CACHE_DIR=off`` (by default it is the machine's: ``compilation_cache``);
    ``present_devices=False`` leaves the CPU device count as it is (a reader that samples on one
    device, as ``python -m dew.sample`` does). ``processes``: the process group to join; None
    reads it from ``group_flags`` (``python -m dew.main``'s ``--coordinator``,
    ``--num_processes``, ``--process_id``), the environment or a cluster JAX detects, unless
    ``detect_processes=False`` (``distributed.requested``). ``recorded``: the kernel decision a
    resumed run recorded (``run.json``'s ``kernels``), kept for settings left at ``auto``. Raises
    ValueError for a setting this machine cannot honour (e.g. ``cpu_convolutions='eigen'`` on an
    XLA without the flag), naming the key; ``distributed.ProcessGroupError`` (a ValueError) for a
    process group that cannot be formed, and ``ConfigError`` for ``config.mesh.devices`` that the
    process count does not divide, before any peer is waited for."""
    section = config.runtime if config is not None and "runtime" in config else _DEFAULTS
    attention = attention_choice(str(section.get("attention", "auto")))
    sizes = _batch_sizes(config or {})
    if processes is None and detect_processes:
        coordinator, count, index = group_flags
        processes = distributed.requested(
            coordinator=coordinator,
            num_processes=count,
            process_id=index,
            initialization_timeout=section["coordinator_timeout"],
        )
    if processes is not None and processes.num_processes > 1:
        if config is not None and "mesh" in config:
            distributed.check_devices(config.mesh.devices, processes.num_processes)
        distributed.start_processes(processes, section["coordinator_timeout"], section["heartbeat_timeout"])
    else:
        processes = None
    global _started
    directory = compilation_cache.cache_directory(section["compilation_cache"], workdir)
    on_cpu = backend.cpu_backend_expected()
    if on_cpu:
        from dew.runtime.cpu.setup import set_up

        count_of = processes.num_processes if processes is not None else 1
        cpu = set_up(
            section,
            batch_sizes=[size // count_of for size in sizes if size % count_of == 0],
            present_devices=present_devices,
            recorded=recorded,
            recorded_in=recorded_in,
        )
        presented, convolutions, choice = cpu.host_devices, cpu.convolutions, cpu.kernels
        decision, freed_memory = cpu.decision, cpu.freed_memory
    else:  # an accelerator: none of the CPU's kernel choices, memory tuning or devices
        presented, decision, freed_memory = None, None, None
        convolutions = "the accelerator's own (no CPU kernel choice)"
        choice = kernels.KernelChoice(
            reason="the accelerator's kernels (no CPU kernel choice)", attention=attention
        )
    kernels.set_choice(choice)
    if directory is not None:
        compilation_cache.enable_compilation_cache(directory)
    _started = Platform(presented, convolutions, choice, directory, processes, decision, freed_memory, on_cpu)
    return _started


__all__ = ["CONFIG", "Platform", "PlatformNotApplied", "start", "start_for", "started"]
