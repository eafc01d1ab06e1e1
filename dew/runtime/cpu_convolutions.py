"""Which library XLA:CPU runs convolutions with: YNNPACK (XLA's default) or Eigen.

XLA:CPU hands each convolution to YNNPACK unless told otherwise; with
``--xla_cpu_experimental_ynn_fusion_type=-individual_convolution`` it runs them with Eigen's
spatial convolution instead (matmuls and reductions stay with YNNPACK). On an x86 CPU with AVX2 and
without AVX-512 (AMD Zen 2, measured in ``benchmarks/RESULTS.md``, issue 12) Eigen's are much
faster: a 32×32 64→64 convolution at batch 64 runs forward in 31 against 71 ms, forward and both
gradients in 122 against 949 ms; the 16×16 EDM U-Net's train step takes 10 % less time and the
32×32×3 one 17 % less, and both compile faster. On an AVX-512 CPU (AMD Zen 5) Eigen's single
convolutions are faster too (32×32 64→64: forward 17 against 28 ms, XLA's weight gradient 36
against 104 ms), but whole train steps are not (YNNPACK against Eigen, one process, alternating
rounds): the 16×16 step 265 and 270 against 284 and 274 ms in two runs, the race's 8×8 network 124
against 122 ms, the 32×32×3 one 3.47 against 3.38 s, compiles equal. So
``route_convolutions("auto")`` picks Eigen only on x86 CPUs with AVX2 and without AVX-512 and
leaves XLA's default everywhere else (AVX-512 CPUs, where it makes no difference; AVX-only CPUs and
ARM, not measured with Eigen; accelerators, where the flag does nothing).

The flag is read once, when JAX starts its CPU backend, so the choice is made before anything
touches a device: ``python -m dew.main`` routes from ``config.mesh.cpu_convolutions``,
``python -m dew.sample`` as ``auto``; a script that builds its own Trainer calls
``route_convolutions`` first (or sets ``XLA_FLAGS`` itself: a flag already there always wins).
The flag is experimental in XLA; it is added only when the installed jaxlib's XLA knows it, since
XLA aborts the process on a flag it does not know. ``convolutions_on_ynnpack`` says, at trace
time, which library this process's flags chose: the EDM layers take a per-tap weight gradient
only where YNNPACK's is the slow one (``dew.networks.edm_layers.xla_weight_grad_is_slow``).
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


def xla_knows_the_flag() -> bool:
    """Whether the installed jaxlib's XLA has the flag and its convolution value (searched for in
    jaxlib's shared libraries, memory-mapped: ~10 ms, nothing imported)."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return False
    names = (FLAG[2:].encode(), b"LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION")
    for folder in spec.submodule_search_locations:
        for path in sorted(glob.glob(os.path.join(folder, "*.so")), key=os.path.getsize, reverse=True):
            try:
                with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    if all(data.find(name) >= 0 for name in names):
                        return True
            except (OSError, ValueError):  # unreadable, or empty (mmap of 0 bytes)
                continue
    return False


def _backend_started() -> bool:
    from dew.runtime.host_devices import backend_started

    return backend_started()


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
            f"config.mesh.cpu_convolutions must be one of {', '.join(map(repr, CHOICES))}, got {choice!r}"
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
                "config.mesh.cpu_convolutions='eigen': this jaxlib's XLA has no "
                f"{FLAG} flag; use 'auto' or 'ynnpack'"
            )
        return "ynnpack"
    os.environ["XLA_FLAGS"] = f"{flags} {EIGEN_ROUTE}".strip()
    return "eigen"
