"""Five things a stix user does that the stix text (../shared/seeds/stix-checkpointing-and-logging.txt)
documents, on tiny hand-built states and real orbax directories: ``restore_ema`` on a state built
by hand, ``step_number`` as the checkpoint key, ``step_to_restore`` as a restore (not a rewrite),
typed PRNG keys, and array-valued ``mse_*`` metrics."""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.checkpointing import Checkpoints
from dew.training import (
    Checkpointer,
    CheckpointerConfig,
    CheckpointRestorationError,
    LoggingCategory,
    TrainingIOHandler,
    convert_mse_to_rmse_in_logs,
    log_metrics_to_line,
    log_metrics_to_table,
)
from dew.training.state import TrainState

sys.path.insert(0, str(pathlib.Path(__file__).parent / "data"))
from make_checkpoint_729b5ab import tiny_state

OLD_CHECKPOINT = pathlib.Path(__file__).parent / "data" / "checkpoint_729b5ab"
OPTIMIZER = optax.adam(1e-3)


def hand_built(step: int, rng: jax.Array | None = None) -> TrainState:
    """A state as a stix user builds one: no ``make_init``, so no EMA law of its own."""
    params = {"w": jnp.full((2, 3), float(step)), "b": jnp.arange(3.0) + step}
    return TrainState(
        step=jnp.int32(step),
        params=params,
        opt_state=OPTIMIZER.init(params),
        ema=jax.tree.map(lambda x: 0.5 * x, params),
        rng=jax.random.PRNGKey(step) if rng is None else rng,
    )


def same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def handler(tmp_path, **config) -> TrainingIOHandler:
    return TrainingIOHandler(
        {"checkpoint_dir": str(tmp_path / "c"), "save_interval_steps": 1, "max_to_keep": 10, **config}
    )


# float32: n roundings in decay**n and a few more in the product and the division, each <= 2**-24,
# amplified by the cancellation in 1 - decay**n
def debias_rtol(decay: float, n: int) -> float:
    return (n + 4) * 2**-24 / (1 - decay**n)


# --- 1. restore_ema on a state built by hand ------------------------------------------------------
def test_restore_ema_works_for_a_hand_built_state_saved_through_the_io_handler(tmp_path, capsys):
    h = handler(tmp_path)
    h.save_checkpoint(hand_built(3), 3, 1.0)
    h.save_checkpoint(hand_built(4), 4, 1.0)
    h.wait_until_finished()
    out = capsys.readouterr().out
    assert out.count("default decay 0.999") == 1  # said once, in one line
    reader = Checkpointer(CheckpointerConfig(checkpoint_dir=str(tmp_path / "c")))
    template = jax.eval_shape(lambda: hand_built(0).params)
    ema = reader.restore_ema(template)  # the documented call, no decay=
    np.testing.assert_allclose(ema["w"], 0.5 * 4 / (1 - 0.999**4), rtol=debias_rtol(0.999, 4))
    # the default was assumed, not known: a caller who knows the run's decay replaces it
    np.testing.assert_allclose(
        reader.restore_ema(template, step=3, decay=0.9)["w"], 1.5 / (1 - 0.9**3), rtol=debias_rtol(0.9, 3)
    )
    pair = reader.restore(hand_built(0))
    assert pair is not None
    restored, _ = pair
    assert same(restored, hand_built(4)) and restored.ema_law is None  # the state round-trips as given


def test_the_io_handlers_ema_decay_is_recorded_and_is_the_truth(tmp_path):
    h = TrainingIOHandler({"checkpoint_dir": str(tmp_path / "c"), "save_interval_steps": 1}, ema_decay=0.9)
    h.save_checkpoint(hand_built(3), 3, 1.0)
    h.wait_until_finished()
    reader = Checkpointer(CheckpointerConfig(checkpoint_dir=str(tmp_path / "c")))
    np.testing.assert_allclose(reader.restore_ema(None)["w"], 1.5 / (1 - 0.9**3), rtol=debias_rtol(0.9, 3))
    with pytest.raises(ValueError, match="contradicts the EMA"):
        reader.restore_ema(None, decay=0.5)


# --- 2. step_number is the checkpoint key ----------------------------------------------------------
def test_save_checkpoint_honours_step_number_as_the_key_with_async_writes(tmp_path):
    h = handler(tmp_path, enable_async_checkpointing=True)
    h.save_checkpoint(hand_built(1), 10, 1.0)  # a loop that counts its own steps
    h.save_checkpoint(hand_built(2), 20, 0.5)
    h.wait_until_finished()
    assert h.checkpointer is not None and h.checkpointer.all_steps() == [10, 20]
    pair = h.checkpointer.restore(hand_built(0), step=10)
    assert pair is not None
    restored, _ = pair
    assert same(restored, hand_built(1))  # the state as saved, at its own step count
    np.testing.assert_allclose(
        h.checkpointer.restore_ema(None, step=20)["b"],
        0.5 * np.arange(2.0, 5.0) / (1 - 0.999**2),
        rtol=debias_rtol(0.999, 2),
    )  # debiased over the state's own count of updates


def test_a_refused_save_is_refused_at_the_call_and_loses_no_other_checkpoint(tmp_path):
    h = handler(tmp_path, enable_async_checkpointing=True)
    h.save_checkpoint(hand_built(1), 1, 1.0)
    with pytest.raises(Exception, match="step 1 was not written"):
        h.save_checkpoint(hand_built(1), 1, 1.0)  # already on disk: refused before it is queued
    h.save_checkpoint(hand_built(2), 2, 1.0)  # the next save is not the one that pays
    h.wait_until_finished()
    assert h.checkpointer is not None and h.checkpointer.all_steps() == [1, 2]


# --- 3. step_to_restore restores; the directory changes when the run saves past it -----------------
def test_step_to_restore_leaves_the_directory_until_the_run_saves_past_it(tmp_path, capsys):
    first = handler(tmp_path)
    for step in (2, 4, 6):
        first.save_checkpoint(hand_built(step), step, 1.0)
    first.wait_until_finished()
    before = sorted(os.listdir(tmp_path))
    h = handler(tmp_path, step_to_restore=2)
    state, _ = h.restore_checkpoint(hand_built(0))
    assert int(state.step) == 2
    assert sorted(os.listdir(tmp_path)) == before and sorted(os.listdir(tmp_path / "c")) == ["2", "4", "6"]
    capsys.readouterr()
    h.save_checkpoint(hand_built(3), 3, 1.0)  # the first save past the restored step
    h.save_checkpoint(hand_built(4), 4, 1.0)
    h.wait_until_finished()
    lines = [line for line in capsys.readouterr().out.splitlines() if "moved" in line]
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("c.rolled-back-")]
    assert len(lines) == 1 and "[4, 6]" in lines[0] and str(aside) in lines[0]
    assert h.checkpointer is not None
    assert sorted(os.listdir(aside)) == ["4", "6"] and h.checkpointer.all_steps() == [2, 3, 4]


# --- 4. typed PRNG keys ------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_a_typed_prng_key_round_trips(tmp_path, impl):
    key = jax.random.split(jax.random.key(0, impl=impl))[1]
    h = handler(tmp_path)
    h.save_checkpoint(hand_built(3, rng=key), 3, 1.0)
    h.wait_until_finished()
    fresh = hand_built(0, rng=jax.random.key(5, impl=impl))
    state, _ = handler(tmp_path, restore_checkpoint_if_exists=True).restore_checkpoint(fresh)
    assert state.rng.dtype == key.dtype and state.rng.shape == key.shape
    assert np.array_equal(jax.random.key_data(state.rng), jax.random.key_data(key))
    assert np.array_equal(jax.random.normal(state.rng, (3,)), jax.random.normal(key, (3,)))  # one stream
    host, _ = Checkpoints(str(tmp_path / "c"), read_only=True).restore(None)  # no template: as saved
    assert host.rng.dtype == key.dtype and np.array_equal(
        jax.random.key_data(host.rng), jax.random.key_data(key)
    )
    other = "rbg" if impl == "threefry2x32" else "unsafe_rbg"
    with pytest.raises(CheckpointRestorationError, match=f"'{impl}' key, the template's a '{other}' key"):
        handler(tmp_path, restore_checkpoint_if_exists=True).restore_checkpoint(
            hand_built(0, rng=jax.random.key(5, impl=other))
        )


def test_a_typed_key_round_trips_through_the_local_tier(tmp_path):
    key = jax.random.key(11)
    c = Checkpoints(
        str(tmp_path / "p"), local_directory=str(tmp_path / "l"), local_every=1, asynchronous=False
    )
    c.save_local(3, hand_built(3, rng=key), None)
    state, _ = c.resume(hand_built(0, rng=jax.random.key(0)))
    assert c.source(3).startswith(str(tmp_path / "l"))
    assert state.rng.dtype == key.dtype and np.array_equal(
        jax.random.key_data(state.rng), jax.random.key_data(key)
    )


def test_a_checkpoint_written_with_a_raw_key_restores_onto_raw_and_typed_templates(tmp_path):
    shutil.copytree(OLD_CHECKPOINT, tmp_path / "old")
    c = Checkpoints(str(tmp_path / "old"), read_only=True)
    raw, _ = c.resume(tiny_state(0))
    assert same(raw, tiny_state(3).replace(ema_law=raw.ema_law)) and raw.rng.dtype == np.uint32
    typed, _ = c.resume(tiny_state(0).replace(rng=jax.random.key(0)))
    assert np.array_equal(jax.random.key_data(typed.rng), jax.random.PRNGKey(7))
    assert np.array_equal(jax.random.normal(typed.rng, (2,)), jax.random.normal(jax.random.PRNGKey(7), (2,)))


# --- 5. array-valued mse_* entries ----------------------------------------------------------------
def test_array_valued_mse_entries_become_rmse_element_wise():
    out = convert_mse_to_rmse_in_logs(
        {"mse_per_channel": np.array([4.0, 9.0]), "eval_mse_map": jnp.array([[1.0, 16.0]]), "x": np.ones(2)}
    )
    assert sorted(out) == ["eval_rmse_map", "rmse_per_channel", "x"]
    np.testing.assert_array_equal(out["rmse_per_channel"], [2.0, 3.0])
    np.testing.assert_array_equal(out["eval_rmse_map"], [[1.0, 4.0]])
    np.testing.assert_array_equal(out["x"], [1.0, 1.0])  # not an mse_ key: as it was


def test_the_console_loggers_show_array_valued_mse_as_rmse():
    line, table = io.StringIO(), io.StringIO()
    log_metrics_to_line(
        LoggingCategory.EVAL_METRICS, {"mse_per_channel": np.array([4.0, 9.0])}, 2, stream=line
    )
    log_metrics_to_table(
        LoggingCategory.EVAL_METRICS, {"mse_per_channel": np.array([4.0, 9.0])}, 2, stream=table
    )
    assert "rmse_per_channel=array[2] mean=2.5" in line.getvalue()
    assert "| rmse_per_channel" in table.getvalue() and "mean=2.5" in table.getvalue()
    assert "mse_per_channel" not in line.getvalue().replace("rmse_per_channel", "")
