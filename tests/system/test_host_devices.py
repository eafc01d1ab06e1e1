"""One XLA CPU device per core (``dew.runtime.cpu.devices``): how many, when the flag is left
alone, and ``python -m dew.main`` splitting its batches over them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers_cli import rows
from helpers_common import ROOT

from dew.runtime.cpu.devices import (
    FLAG,
    cpu_cores,
    flagged_count,
    host_device_count,
    present_host_devices,
)
from dew.runtime.cpu.flags import eigen_measured_faster, xla_knows_the_flag

BATCH = 30
MIXTURE = [
    f"--config={ROOT / 'experiments' / 'mixture2d.py'}",
    "--config.model.width=16",
    "--config.model.blocks=1",
    f"--config.dataset.batch_size={BATCH}",
    "--config.train.num_steps=4",
    "--config.train.log_every=2",
    "--config.checkpoint.every=4",
    "--config.eval.every=0",
    "--config.preview.every=0",
]


@pytest.mark.parametrize(
    "requested, batch_sizes, cores, expected",
    [
        (3, [64], 8, 3),  # an explicit count is taken as asked
        (0, [64], 8, 8),  # one per core
        (0, [64], 2, 2),
        (0, [12], 8, 6),  # the largest count up to the cores that splits the batch
        (0, [64, 12], 8, 4),  # ... and the evaluation batch
        (0, [13], 8, 1),  # a prime batch above the cores: one device
        (0, [7], 8, 7),
        (0, [64], 1, 1),
    ],
)
def test_the_automatic_count_is_the_most_cores_the_batches_split_over(
    requested, batch_sizes, cores, expected
):
    assert host_device_count(requested, batch_sizes, cores) == expected


def test_the_count_already_in_xla_flags_is_read_last_one_winning():
    assert flagged_count("") is None
    assert flagged_count("--xla_cpu_enable_fast_math=false") is None
    assert flagged_count(f"{FLAG}=4 --foo {FLAG}=6") == 6


def test_a_count_set_by_the_user_or_a_started_backend_is_left_alone(monkeypatch):
    import jax

    monkeypatch.setenv("XLA_FLAGS", f"--xla_cpu_enable_fast_math=false {FLAG}=8")
    assert present_host_devices(2) is None
    assert os.environ["XLA_FLAGS"] == f"--xla_cpu_enable_fast_math=false {FLAG}=8"
    jax.devices()  # the backend has started: a flag set now would not take effect
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert present_host_devices(2) is None
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    with pytest.raises(ValueError, match="count must be an int >= 1, got 0"):
        present_host_devices(0)


def test_a_fresh_process_presents_the_devices_asked_for_and_keeps_other_flags():
    code = (
        "import os, jax\n"
        "from dew.runtime.cpu.devices import present_host_devices\n"
        "print(present_host_devices(3), os.environ['XLA_FLAGS'], len(jax.devices('cpu')))\n"
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_cpu_enable_fast_math=false", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["3", "--xla_cpu_enable_fast_math=false", f"{FLAG}=3", "3"]


def _cli(workdir, *overrides: str) -> subprocess.CompletedProcess:
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(FLAG))
    env = {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "dew.main", f"--workdir={workdir}", *MIXTURE, *overrides]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


def test_dew_main_splits_each_batch_over_one_device_per_core(tmp_path):
    expected = host_device_count(0, [BATCH], cpu_cores())
    run = _cli(tmp_path / "auto")
    assert run.returncode == 0, run.stderr
    said = f"dew: each batch is split over {expected} CPU devices (config.runtime.host_devices)"
    assert (said in run.stdout) == (expected > 1), run.stdout
    library = "eigen" if eigen_measured_faster() and xla_knows_the_flag() else "ynnpack"
    assert f"dew: XLA:CPU runs convolutions with {library} (config.runtime.cpu_convolutions)" in run.stdout
    assert [r["step"] for r in rows(tmp_path / "auto") if r["category"] == "train"] == [2, 4]

    # An explicit count the batch does not split over: one line naming the keys, nothing trained.
    bad = _cli(tmp_path / "bad", "--config.runtime.host_devices=4")
    assert bad.returncode == 2, bad.stderr
    assert "config.mesh / config.dataset.batch_size" in bad.stderr
    assert "30 is not divisible" in bad.stderr and "use a multiple of 4" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad" / "tracking").exists()
    bad = _cli(tmp_path / "bad_library", "--config.runtime.cpu_convolutions=fast")
    assert bad.returncode == 2, bad.stderr
    assert "config.runtime.cpu_convolutions" in bad.stderr, bad.stderr
    assert "expected one of ('auto', 'eigen', 'ynnpack')" in bad.stderr, bad.stderr
