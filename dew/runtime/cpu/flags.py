"""XLA:CPU's flags for the kernels a run uses: the convolution library, and the rule that picks
it from the CPU's features.

XLA:CPU hands each convolution to YNNPACK unless ``--xla_cpu_experimental_ynn_fusion_type=
-individual_convolution`` routes them to Eigen's spatial convolution. On x86 CPUs with AVX2 and
without AVX-512 (Zen 2) Eigen's are much faster (the 32×32×3 U-Net's step 17 % less time); on
AVX-512 CPUs whole steps are not (``benchmarks/RESULTS.md``). So ``route_convolutions("auto")``
picks Eigen only on x86 CPUs with AVX2 and without AVX-512 and leaves XLA's default elsewhere;
timing every shape class on the machine (the measured choice this rule once backed up) chose the
same library on both CPUs it was compared on. ``weight_gradient_choice`` turns the library and
the CPU into the per-tap weight-gradient choice the EDM layers receive (``dew.kernels``). Dots
stay where XLA puts them: nothing here hands them to oneDNN (``benchmarks/RESULTS.md``: its
dots aborted a transformer's run on an AVX-512 CPU).

Every flag is read once, when JAX starts its CPU backend, so the routes are set before anything
touches a device; ``XLA_FLAGS`` already setting one always wins, and a flag is added only when
the installed jaxlib's XLA knows it (XLA aborts the process on a flag it does not know).
"""

from __future__ import annotations

import glob
import importlib.util
import mmap
import os
import re

FLAG = "--xla_cpu_experimental_ynn_fusion_type"
EIGEN_ROUTE = f"{FLAG}=-individual_convolution"
CHOICES = ("auto", "eigen", "ynnpack")
_CONVOLUTION = "individual_convolution"


def cpu_features() -> dict[str, bool]:
    """numpy's runtime CPU-dispatch table (x86 names such as ``AVX2``, ``AVX512F``)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as features
    return dict(features)


def eigen_measured_faster(features: dict[str, bool] | None = None) -> bool:
    """Whether this CPU is one where Eigen's convolutions were measured faster than YNNPACK's:
    x86 with AVX2 and without AVX-512."""
    features = cpu_features() if features is None else features
    return bool(features.get("AVX2")) and not features.get("AVX512F")


def library_in_flags(xla_flags: str) -> str | None:
    """The convolution library ``xla_flags`` chooses (``"eigen"`` or ``"ynnpack"``), or None when
    it does not set the YNNPACK fusion types (XLA's default: YNNPACK). The last setting counts; a
    value of ``+type``/``-type`` items edits XLA's default set, which includes convolutions, any
    other value replaces it."""
    found = re.findall(rf"{FLAG}=(\S*)", xla_flags)
    if not found:
        return None
    items = [item.strip().lower().replace("library_fusion_type_", "") for item in found[-1].split(",")]
    items = [item for item in items if item]
    if items and all(item[0] in "+-" for item in items):
        on = True
        for item in items:
            if item[1:] == _CONVOLUTION:
                on = item[0] == "+"
    else:
        on = _CONVOLUTION in items
    return "ynnpack" if on else "eigen"


def convolutions_on_ynnpack(xla_flags: str | None = None) -> bool:
    """Whether XLA:CPU runs this process's convolutions with YNNPACK (default: read ``XLA_FLAGS``,
    which XLA read the same way when the backend started)."""
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    return library_in_flags(flags) != "eigen"


def _jaxlib_has(*names: bytes) -> bool:
    """Whether one of the installed jaxlib's shared libraries holds all of ``names`` (memory-mapped:
    ~10 ms, nothing imported)."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return False
    for folder in spec.submodule_search_locations:
        for path in sorted(glob.glob(os.path.join(folder, "*.so")), key=os.path.getsize, reverse=True):
            try:
                with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    if all(data.find(name) >= 0 for name in names):
                        return True
            except (OSError, ValueError):  # unreadable, or empty (mmap of 0 bytes)
                continue
    return False


def xla_knows_the_flag() -> bool:
    """Whether the installed jaxlib's XLA has the flag and its convolution value."""
    return _jaxlib_has(FLAG[2:].encode(), b"LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION")


def _backend_started() -> bool:
    from dew.runtime.backend import backend_started

    return backend_started()


#: Images with at least this many pixels (32×32 and up) take the per-tap weight gradient on CPUs
#: where XLA's own is slow there (``weight_gradient_choice``).
TAPWISE_MIN_POSITIONS = 1024


def xla_weight_grad_is_slow(features: dict[str, bool] | None = None, xla_flags: str | None = None) -> bool:
    """Whether XLA's convolution weight gradient degrades on large images here: YNNPACK's, on x86
    CPUs without AVX-512.

    Measured on three CPUs (``benchmarks/RESULTS.md``), XLA:CPU's weight gradient of a
    32×32 convolution through YNNPACK (XLA's default library) against the per-tap sum, and the
    32×32×3 train step with each: AVX+FMA only, 7-8× slower per layer, the step 2.6× slower; AVX2
    (Zen 2), 5.3× per layer, the step 1.9× slower; AVX-512 (avx512f/bw/bf16), the faster of the
    two (per layer 2×, the step 1.13×). Where this process's convolutions run on Eigen instead
    (the default on AVX2 CPUs without AVX-512) XLA's gradient is the faster again (per layer
    75-84 against 163 ms on Zen 2). Other CPUs (ARM) keep XLA's gradient: not measured there.
    """
    if not convolutions_on_ynnpack(xla_flags):
        return False
    features = cpu_features() if features is None else features
    return bool(features.get("AVX")) and not features.get("AVX512F")


def weight_gradient_choice(features: dict[str, bool] | None = None, xla_flags: str | None = None):
    """The ``dew.kernels.KernelChoice`` for this CPU and this process's convolution library: the
    per-tap weight gradient from ``TAPWISE_MIN_POSITIONS`` pixels where ``xla_weight_grad_is_slow``,
    else XLA's. On small images the two are within 2× of each other per layer, the whole
    8×8/16×16 train step within ±4 %, and the per-tap form costs 10-60 % more step compile time."""
    from dew.kernels import KernelChoice

    if xla_weight_grad_is_slow(features, xla_flags):
        return KernelChoice(
            TAPWISE_MIN_POSITIONS,
            f"per-tap from {TAPWISE_MIN_POSITIONS} pixels (YNNPACK's is slow on x86 without AVX-512)",
        )
    return KernelChoice(None, "XLA's weight gradient")


def route_convolutions(choice: str = "auto") -> str:
    """Choose XLA:CPU's convolution library for this process by adding the flag to ``XLA_FLAGS``.

    ``choice``: ``"auto"`` (Eigen where ``eigen_measured_faster`` and XLA knows the flag, else
    XLA's default), ``"eigen"`` or ``"ynnpack"``. Returns the library in effect. ``XLA_FLAGS``
    already setting the fusion types wins (nothing is changed), and so does a backend that has
    already started (the flag could no longer take effect). Raises ValueError for an unknown
    choice, or for ``"eigen"`` on a jaxlib whose XLA does not have the flag.
    """
    if choice not in CHOICES:
        raise ValueError(
            f"config.runtime.cpu_convolutions must be one of {', '.join(map(repr, CHOICES))}, got {choice!r}"
        )
    flags = os.environ.get("XLA_FLAGS", "")
    chosen = library_in_flags(flags)
    if chosen is not None:
        return chosen
    if choice == "ynnpack" or _backend_started():
        return "ynnpack"
    if choice == "auto" and not eigen_measured_faster():
        return "ynnpack"
    if not xla_knows_the_flag():
        if choice == "eigen":
            raise ValueError(
                "config.runtime.cpu_convolutions='eigen': this jaxlib's XLA has no "
                f"{FLAG} flag; use 'auto' or 'ynnpack'"
            )
        return "ynnpack"
    os.environ["XLA_FLAGS"] = f"{flags} {EIGEN_ROUTE}".strip()
    return "eigen"
