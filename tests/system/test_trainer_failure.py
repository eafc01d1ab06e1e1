"""A non-finite loss stops the run naming the step, the statistic and the last good checkpoint,
with nothing saved after it; or, configured to skip, drops the update and counts it."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from helpers_common import tiny_config
from helpers_trainer import trace_steps

from dew.training.nonfinite import NonFiniteError
from dew.training.trainer import Trainer

BAD_STEP = 5


def poisoned_trainer(workdir, **overrides):
    """A Trainer whose training batch number BAD_STEP holds one NaN pixel."""
    config = tiny_config(**{"train.num_steps": 8, "checkpoint.every": 2, "eval.every": 0, **overrides})
    trainer = Trainer(config, str(workdir))
    data = trainer.train_data
    start = data.save_position()  # read ahead to batch BAD_STEP, then rewind to where the run starts
    for _ in range(BAD_STEP - 1):
        next(data)
    image = np.asarray(next(data)["image"])[3]
    data.read_position(start)
    fields = {k: v.copy() for k, v in data.source.fields.items()}
    (row,) = np.flatnonzero((fields["image"] == image).reshape(len(fields["image"]), -1).all(axis=1))
    fields["image"][row] = np.nan
    data.source = dataclasses.replace(data.source, fields=fields)
    return trainer


def test_a_nan_loss_stops_the_run_naming_step_statistic_and_last_good_checkpoint(tmp_path):
    trainer = poisoned_trainer(tmp_path / "run")
    with pytest.raises(NonFiniteError) as caught:
        trainer.run()
    message = str(caught.value)
    assert trainer.checkpoints is not None
    assert f"non-finite loss (nan) at step {BAD_STEP}" in message
    assert f"Last good checkpoint: {trainer.checkpoints.path(4)}" in message
    # Nothing saved after the bad step; what was saved is intact and finite.
    assert trainer.checkpoints.all_steps() == [2, 4]
    state, _ = trainer.checkpoints.restore()
    assert int(state.step) == 4
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(state.params))


def test_the_skip_policy_drops_the_update_counts_it_and_profiles_a_window(tmp_path):
    workdir = tmp_path / "run"
    trainer = poisoned_trainer(
        workdir, **{"train.nonfinite": "skip", "profile.steps": 2, "profile.warmup": 3}
    )
    state = trainer.run()
    assert int(state.step) == 8
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(state.params))
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(state.ema))
    rows = [json.loads(line) for line in (workdir / "tracking" / "scalars.jsonl").read_text().splitlines()]
    skips = {r["step"]: r["skipped_updates"] for r in rows if r["category"] == "train"}
    assert skips == {2: 0, 4: 0, 6: 1, 8: 0}
    assert trainer.checkpoints is not None and trainer.checkpoints.latest == 8
    # The profile knob: one window of steps 4 and 5 (after 3 warm-up steps) under <workdir>/profile.
    assert trace_steps(workdir / "profile") == [4, 5]
