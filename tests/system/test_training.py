"""The vertical slice end to end on a tiny model: exact resume, the files a run leaves, and
the command line."""

from __future__ import annotations

import json
import subprocess

import jax
import numpy as np
from helpers_cli import cli
from helpers_common import tiny_config
from PIL import Image

from dew.training.trainer import Trainer


def assert_states_identical(a, b):
    for name in ("step", "params", "opt_state", "ema", "rng"):
        leaves_a, leaves_b = jax.tree.leaves(getattr(a, name)), jax.tree.leaves(getattr(b, name))
        assert len(leaves_a) == len(leaves_b)
        for x, y in zip(leaves_a, leaves_b, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def test_a_stopped_and_resumed_run_ends_bit_identical_to_a_straight_run(tmp_path):
    straight = Trainer(tiny_config(**{"train.num_steps": 6}), str(tmp_path / "straight")).run()

    interrupted = tmp_path / "interrupted"
    first = Trainer(tiny_config(**{"train.num_steps": 4, "checkpoint.every": 2}), str(interrupted)).run()
    assert int(first.step) == 4
    resumed_trainer = Trainer(tiny_config(**{"train.num_steps": 6}), str(interrupted))
    assert resumed_trainer.checkpoints is not None and resumed_trainer.checkpoints.latest == 4
    resumed = resumed_trainer.run()

    assert_states_identical(straight, resumed)

    # The training losses logged after the resume match the straight run's too.
    def losses(run):
        rows = [
            json.loads(line)
            for line in (tmp_path / run / "tracking" / "scalars.jsonl").read_text().splitlines()
        ]
        return {r["step"]: r["loss"] for r in rows if r["category"] == "train"}

    assert losses("interrupted")[6] == losses("straight")[6]


def test_a_run_leaves_checkpoints_metrics_previews_and_metadata(tmp_path):
    workdir = tmp_path / "run"
    Trainer(tiny_config(), str(workdir)).run()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]
    rows = [json.loads(line) for line in (workdir / "tracking" / "scalars.jsonl").read_text().splitlines()]
    categories = {r["category"] for r in rows}
    assert {"train", "eval", "system"} <= categories
    assert any("digits_class_accuracy" in r for r in rows)
    assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
    grid = Image.open(workdir / "previews" / "samples.png")
    # one row per class (10), per_class=2 columns of 8x8 digits enlarged 8x with 4px gutters
    assert grid.size == (2 * 68 + 4, 10 * 68 + 4)
    metadata = json.loads((workdir / "run.json").read_text())
    assert metadata["config"]["model"]["model_channels"] == 8


def test_the_command_line_trains_and_a_second_call_resumes(tmp_path):
    def run(num_steps: int) -> subprocess.CompletedProcess:
        return cli(
            tmp_path / "cli", experiment="edm", **{"train.num_steps": num_steps, "checkpoint.every": 2}
        )

    first = run(4)
    assert first.returncode == 0, first.stderr
    assert "done at step 4" in first.stdout
    again = run(6)
    assert again.returncode == 0, again.stderr
    assert "resuming from step 4" in again.stdout and "done at step 6" in again.stdout
