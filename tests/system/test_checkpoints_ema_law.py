"""``restore_ema`` as the stix text writes it: it reads ``ema_params`` and ``extra`` and applies the
live loop's correction, everything that correction needs (β's half-life schedule, the number of
updates, the accumulation, the tracked leaves) being in ``extra``, written by every save path
that has an EMA: the Trainer, ``Checkpoints``, ``Checkpointer`` and ``TrainingIOHandler``."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from helpers_common import tiny_config

from dew.averaging import ema as ema_lib
from dew.checkpointing import Checkpoints
from dew.training import Checkpointer, CheckpointerConfig, TrainingIOHandler
from dew.training.trainer import Trainer

# Every part of the law differs from the defaults: a ramped half-life, two micro-batches per
# update, and only the weights averaged (biases hold the live parameter).
EMA = {
    "ema.half_life": 5.0,
    "ema.ramp_up": 0.3,
    "ema.tracks": "weight$",
    "train.accumulation": 2,
    "train.num_steps": 6,
    "checkpoint.every": 3,
    "eval.every": 0,
    "preview.every": 0,
    "checkpoint.keep_best": False,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A Trainer run of 6 steps (3 EMA updates) and its final state."""
    workdir = tmp_path_factory.mktemp("run")
    trainer = Trainer(tiny_config(**EMA), str(workdir))
    state = trainer.run()
    assert trainer.checkpoints is not None
    trainer.checkpoints.wait()
    return trainer, state, workdir


def drop_metadata_record(step_dir: pathlib.Path) -> None:
    """Remove the JSON EMA record from the step's metadata: what is left is ``extra``."""
    path = step_dir / "_CHECKPOINT_METADATA"
    meta = json.loads(path.read_text())
    meta["custom_metadata"].pop("ema", None)
    path.write_text(json.dumps(meta))


def extra_item(step_dir: pathlib.Path) -> dict:
    return ocp.PyTreeCheckpointHandler().metadata(epath.Path(step_dir / "extra")).tree


def assert_the_live_correction(trainer, state, restored) -> None:
    live = trainer.debiased_ema(state)  # what the run evaluates, previews and exports
    assert jax.tree.structure(restored) == jax.tree.structure(live)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(live), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # the same IEEE ops


def test_the_state_carries_the_ema_law_make_init_gives_it(run):
    trainer, state, _ = run
    spec, k = ema_lib.from_law(jax.device_get(state.ema_law), state.params)
    run_spec = trainer.averages.ema.law_spec
    assert (spec.half_life, spec.ramp_up, spec.decay, k) == (5.0, 0.3, run_spec.decay, 2)
    mask = jax.tree.leaves(spec.mask(state.params))
    assert mask == jax.tree.leaves(run_spec.mask(state.params)) and any(mask) and not all(mask)


def test_the_trainers_checkpoints_hold_the_law_in_extra_and_restore_ema_applies_it(run):
    trainer, state, workdir = run
    step_dir = workdir / "checkpoints" / "6"
    assert set(extra_item(step_dir)["ema"]) == {"decay", "half_life", "ramp_up", "accumulation", "tracked"}
    drop_metadata_record(step_dir)
    reader = Checkpointer(CheckpointerConfig(checkpoint_dir=str(workdir / "checkpoints"), max_to_keep=None))
    template = jax.eval_shape(lambda: state.params)
    assert_the_live_correction(trainer, state, reader.restore_ema(template, step=6))


def test_checkpoints_save_writes_the_law_into_extra(run, tmp_path):
    trainer, state, _ = run
    checkpoints = Checkpoints(str(tmp_path / "c"), asynchronous=False)
    checkpoints.save(6, state, None)
    drop_metadata_record(tmp_path / "c" / "6")
    assert_the_live_correction(trainer, state, Checkpoints(str(tmp_path / "c")).restore_ema(None))

    # a state without a law, saved by Checkpoints given the run's EMA record: extra holds it too
    bare = Checkpoints(str(tmp_path / "r"), asynchronous=False, ema=trainer.ema_record)
    bare.save(6, state.replace(ema_law=None), None)
    drop_metadata_record(tmp_path / "r" / "6")
    assert "ema" in extra_item(tmp_path / "r" / "6")
    assert_the_live_correction(trainer, state, Checkpoints(str(tmp_path / "r")).restore_ema(None))


def test_checkpointer_save_of_the_state_alone_then_restore_ema_of_a_template(run, tmp_path):
    trainer, state, _ = run
    checkpointer = Checkpointer(CheckpointerConfig(checkpoint_dir=str(tmp_path / "c"), save_interval_steps=1))
    checkpointer.save(state, 6, 0.5)  # the stix call: no decay anywhere
    drop_metadata_record(tmp_path / "c" / "6")
    template = jax.eval_shape(lambda: state.params)
    assert_the_live_correction(trainer, state, checkpointer.restore_ema(template))
    pair = checkpointer.restore(state)
    assert pair is not None
    restored, _ = pair
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(restored.ema_law), jax.tree.leaves(state.ema_law), strict=True)
    )
    # a state without a law is saved with an assumed default in the metadata record only: with
    # that record gone there is nothing to debias with (the record was what made it work)
    checkpointer.save(state.replace(ema_law=None, step=state.step + 3), 9, 0.5)
    record = checkpointer.checkpoints.ema_record(9)
    assert record is not None and record["assumed"] is True
    drop_metadata_record(tmp_path / "c" / "9")
    with pytest.raises(ValueError, match="records no EMA law"):
        checkpointer.restore_ema(template, step=9)


def test_training_io_handler_save_checkpoint_writes_the_law_into_extra(run, tmp_path):
    trainer, state, _ = run
    handler = TrainingIOHandler({"checkpoint_dir": str(tmp_path / "c"), "save_interval_steps": 3})
    handler.save_checkpoint(state, 6, 0.5)
    handler.wait_until_finished()
    drop_metadata_record(tmp_path / "c" / "6")
    template = jax.eval_shape(lambda: state.params)
    assert handler.checkpointer is not None
    assert_the_live_correction(trainer, state, handler.checkpointer.restore_ema(template))
