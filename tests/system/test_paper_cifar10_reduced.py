"""The paper's CIFAR-10 configuration (``experiments/edm_paper.py:cifar10-cond-ddpmpp``) trains
here at reduced size: the real file, ``python -m dew.main`` on tfds's mock CIFAR-10
(``experiments/tfds_mock_run.py``), augmentation on (the file's p = 0.12 pipeline), a 2-device
mesh, a checkpoint mid-run, and a resume from it that ends bit-identical to the straight run.

Only sizes change (``REDUCED``: channels, blocks, batch, duration, and the image-counted
schedules shortened to match); every other setting is the row's. The command and its numbers
are in ``experiments/RESULTS.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers_common import ROOT

from dew.checkpointing import Checkpoints
from dew.pytrees import leaf_path

RUNNER = str(ROOT / "experiments" / "tfds_mock_run.py")
CONFIG = f"{ROOT / 'experiments' / 'edm_paper.py'}:cifar10-cond-ddpmpp"
STEPS, MID = 8, 4
REDUCED = {
    "dataset.batch_size": 8,
    "model.model_channels": 16,
    "model.channel_mult": "(1,2)",
    "model.num_blocks": 1,
    "model.attn_resolutions": "(16,)",
    "train.num_steps": STEPS,
    "train.log_every": 2,
    # The image-counted schedules, shortened with the run (still fractional: lr·min(n/W, 1)).
    "optimizer.warmup_steps": 2.5,
    "ema.half_life": 2.5,
    "checkpoint.every": MID,
    "checkpoint.keep": 2,
    "preview.every": 0,
    "mesh.devices": 2,
}


def launch(workdir, cache, **extra) -> subprocess.CompletedProcess:
    overrides = {**REDUCED, "runtime.compilation_cache": str(cache), **extra}
    argv = [sys.executable, RUNNER, "--num_examples=64", "--", f"--config={CONFIG}", f"--workdir={workdir}"]
    argv += [f"--config.{k}={v}" for k, v in overrides.items()]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


def state_at(workdir, step):
    checkpoints = Checkpoints(str(workdir / "checkpoints"), keep=2)
    try:
        state, _ = checkpoints.restore(None, step)
    finally:
        checkpoints.close()
    return state


def leaves(tree) -> dict:
    import jax

    return {leaf_path(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.slow
def test_reduced_cifar10_paper_config_trains_on_two_devices_and_resumes_bit_exactly(tmp_path):
    cache = ROOT / ".cache" / "jax-tests"
    straight = tmp_path / "straight"
    first = launch(straight, cache)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "each batch is split over 2 CPU devices" in first.stdout, first.stdout
    with open(straight / "tracking" / "scalars.jsonl") as f:
        rows = [json.loads(line) for line in f]
    losses = [r["loss"] for r in rows if r["category"] == "train"]
    assert len(losses) == STEPS // 2 and all(np.isfinite(losses)), rows

    # The resume: a copy of the run rolled back to its mid-run checkpoint, trained on to the end.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("run.lock"))
    second = launch(resumed, cache, **{"checkpoint.step_to_restore": MID, "checkpoint.on_rollback": "delete"})
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from step {MID} " in second.stdout, second.stdout

    mid, want, got = state_at(straight, MID), state_at(straight, STEPS), state_at(resumed, STEPS)
    assert int(want.step) == int(got.step) == STEPS
    a, b = leaves(want), leaves(got)
    assert sorted(a) == sorted(b)
    for name in a:  # params, optimizer state, EMA, rng key, step
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)

    # Augmentation ran: map_augment sees all-zero labels without it (zero gradient, so Adam
    # leaves it where it started); with it, the x-flip label is 1 for about half the images.
    moved = {
        name: not np.array_equal(value, leaves(mid)[name])
        for name, value in a.items()
        if "map_augment" in name and name.startswith("params")
    }
    assert moved and all(moved.values()), moved
