"""The U-Net benchmark's dew side is measured with the kernels a user's run gets: its convolution
shapes are traced before JAX starts (as ``dew.kernel_probe`` traces a run's), so the kernel choice
measures them rather than falling back to the CPU-flag rule."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers_common import ROOT

TRACE = """
import json
from benchmarks.unet import traced_convolutions
from dew.runtime.host_devices import backend_started
from dew.runtime.kernel_choice import _without_backend

with _without_backend():
    shapes = traced_convolutions("16", 8)
print(json.dumps({"started": backend_started(), "shapes": shapes}))
"""


def test_the_benchmark_traces_its_convolutions_without_starting_jax():
    done = subprocess.run(
        [sys.executable, "-c", TRACE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["started"] is False
    assert result["shapes"]["batch"] == 8
    assert len(result["shapes"]["convolutions"]) >= 4  # the 16x16 U-Net's 3x3 and 1x1 classes
