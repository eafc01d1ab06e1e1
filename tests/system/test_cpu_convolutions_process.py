"""XLA:CPU's convolution library (``dew.runtime.cpu.flags``) in a fresh process: its XLA
compiles with the choice, and both libraries compute the same convolution. (Which one ``auto``
picks: tests/test_cpu_convolutions.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from helpers_common import ROOT

CONVOLVE = """
import json, sys
import numpy as np
from dew.runtime.cpu.flags import route_convolutions
library = route_convolutions(sys.argv[1])
import jax
rng = np.random.default_rng(0)
x, w = rng.standard_normal((4, 16, 16, 32), np.float32), rng.standard_normal((3, 3, 32, 32), np.float32)
numbers = ("NHWC", "HWIO", "NHWC")
conv = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=numbers))
np.save(sys.argv[2], np.asarray(conv(x, w)))
print(json.dumps({"library": library}))
"""


def _convolve(choice: str, tmp_path) -> tuple[str, np.ndarray, str]:
    """(library, the convolution's output, XLA's dumped debug options of the program) in a fresh process."""
    dump = tmp_path / f"dump_{choice}"
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}", "PYTHONPATH": str(ROOT)}
    out = tmp_path / f"{choice}.npy"
    run = subprocess.run(
        [sys.executable, "-c", CONVOLVE, choice, str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    (options,) = [p for p in dump.iterdir() if "jit__lambda" in p.name and p.name.endswith(".debug_options")]
    return json.loads(run.stdout.splitlines()[-1])["library"], np.load(out), options.read_text()


def test_a_fresh_process_compiles_with_the_library_chosen_and_both_agree(tmp_path):
    eigen, y_eigen, options_eigen = _convolve("eigen", tmp_path)
    ynnpack, y_ynnpack, options_ynnpack = _convolve("ynnpack", tmp_path)
    assert (eigen, ynnpack) == ("eigen", "ynnpack")
    # XLA's debug options as it compiled the program: convolutions dropped from YNNPACK's set.
    types = [line.split(":")[1].strip() for line in options_eigen.splitlines() if "ynn_fusion_type" in line]
    assert (
        "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION" not in types
        and "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT" in types
    )
    assert "ynn_fusion_type" not in options_ynnpack  # XLA's default set, convolutions included
    # The same sums in another order: each output within float32 rounding of n = 3·3·32 products,
    # |Σ - fl(Σ)| ≤ γ_n Σ|x||w| for each (Higham, Accuracy and Stability, eq. 3.5), so the two
    # differ by at most 2 γ_n Σ|x||w|.
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 16, 16, 32), np.float32), rng.standard_normal((3, 3, 32, 32), np.float32)
    xp = np.pad(np.abs(x).astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    magnitude = sum(
        np.einsum("bhwc,co->bhwo", xp[:, i : i + 16, j : j + 16], np.abs(w[i, j]).astype(np.float64))
        for i in range(3)
        for j in range(3)
    )
    n, u = 3 * 3 * 32, np.finfo(np.float32).eps / 2
    assert np.all(np.abs(y_eigen.astype(np.float64) - y_ynnpack) <= 2 * n * u / (1 - n * u) * magnitude)
