"""The stix checkpointing and logging API (../shared/seeds/stix-checkpointing-and-logging.txt),
one test per documented sentence, on real orbax directories. A stix ``TrainingState`` is dew's
``TrainState``; a params ``State`` is a params pytree."""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import pathlib
import shutil
import typing

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.checkpointing import Checkpointer
from dew.training import Checkpointer as CheckpointerFromTraining
from dew.training import (
    CheckpointerConfig,
    CheckpointRestorationError,
    LoggingCategory,
    TrainingIOHandler,
    TrainingIOHandlerConfig,
    convert_mse_to_rmse_in_logs,
    get_debiased_ema,
    log_metrics_to_line,
    log_metrics_to_table,
    read_run_metadata,
    save_run_metadata,
)
from dew.training.state import TrainState

OPTIMIZER = optax.adam(1e-3)


def state_at(step: int) -> TrainState:
    params = {"w": jnp.full((4, 3), float(step)), "b": jnp.arange(3.0) + step}
    opt_state = OPTIMIZER.init(params)
    opt_state = jax.tree.map(lambda x: x + step if x.dtype == jnp.float32 else x, opt_state)
    return TrainState(
        step=jnp.int32(step),
        params=params,
        opt_state=opt_state,
        ema=jax.tree.map(lambda x: 0.5 * x, params),
        rng=jax.random.PRNGKey(step),
    )


def same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def checkpointer(tmp_path, **kw) -> Checkpointer:
    return Checkpointer(
        CheckpointerConfig(checkpoint_dir=str(tmp_path / "ckpt"), save_interval_steps=1, **kw)
    )


# --- the configs -----------------------------------------------------------------------------------
def restored_pair(c: Checkpointer, *args: typing.Any, **kwargs: typing.Any) -> tuple[TrainState, typing.Any]:
    """``c.restore(*args, **kwargs)`` where a checkpoint was saved: the state and dataset state it
    must then give (``restore`` gives None only when there is no checkpoint)."""
    pair = c.restore(*args, **kwargs)
    assert pair is not None
    return pair


def test_training_io_handler_config_has_the_documented_defaults():
    c = TrainingIOHandlerConfig()
    assert c.model_dump() == {
        "checkpoint_dir": None,
        "restore_dir": None,
        "max_to_keep": 5,
        "save_interval_steps": None,
        "keep_best": True,
        "enable_async_checkpointing": False,
        "restore_checkpoint_if_exists": False,
        "step_to_restore": None,
        "restore_optimizer_state": True,
        "clear_previous_checkpoints": False,
    }
    assert TrainingIOHandlerConfig.model_config == {"extra": "forbid"}
    assert TrainingIOHandler.Config is TrainingIOHandlerConfig


def test_checkpointer_config_has_the_documented_defaults_and_checkpoint_dir_is_required():
    import pydantic

    c = CheckpointerConfig(checkpoint_dir="x")
    assert c.model_dump() == {
        "checkpoint_dir": "x",
        "max_to_keep": 5,
        "save_interval_steps": 100,
        "keep_best": True,
        "enable_async_checkpointing": False,
    }
    assert Checkpointer.Config is CheckpointerConfig and CheckpointerFromTraining is Checkpointer
    required = r"CheckpointerConfig\ncheckpoint_dir\n  Field required"
    with pytest.raises(pydantic.ValidationError, match=required):
        CheckpointerConfig()  # pyright: ignore[reportCallIssue]  # the refusal under test
    with pytest.raises(TypeError):  # keyword-only
        CheckpointerConfig("x")  # pyright: ignore[reportCallIssue]  # the refusal under test


def test_the_configs_are_pydantic_models_with_the_documented_model_config_and_constraints():
    import annotated_types
    import pydantic

    assert issubclass(TrainingIOHandlerConfig, pydantic.BaseModel)
    assert issubclass(CheckpointerConfig, pydantic.BaseModel)
    assert TrainingIOHandlerConfig.model_config == {"extra": "forbid"}
    assert CheckpointerConfig.model_config == {"arbitrary_types_allowed": True}
    gt0 = annotated_types.Gt(gt=0)
    fields = TrainingIOHandlerConfig.model_fields
    assert fields["max_to_keep"].annotation is int and fields["max_to_keep"].metadata == [gt0]
    for name in ("save_interval_steps", "step_to_restore"):  # Annotated[int, Field(gt=0)] | None
        (positive, none) = typing.get_args(fields[name].annotation)
        assert none is type(None) and typing.get_args(positive)[1].metadata == [gt0]
    fields = CheckpointerConfig.model_fields
    assert fields["save_interval_steps"].metadata == [gt0]
    (positive, none) = typing.get_args(fields["max_to_keep"].annotation)  # Annotated[int, Gt(0)] | None
    assert none is type(None) and typing.get_args(positive)[1:] == (gt0,)
    assert fields["checkpoint_dir"].is_required()


@pytest.mark.parametrize(
    ("cls", "field", "value", "error"),
    [
        (TrainingIOHandlerConfig, "max_to_keep", 0, "Input should be greater than 0"),
        (TrainingIOHandlerConfig, "max_to_keep", None, "Input should be a valid integer"),
        (TrainingIOHandlerConfig, "save_interval_steps", 0, "Input should be greater than 0"),
        (TrainingIOHandlerConfig, "step_to_restore", -2, "Input should be greater than 0"),
        (TrainingIOHandlerConfig, "keep_best", "perhaps", "Input should be a valid boolean"),
        (CheckpointerConfig, "max_to_keep", 0, "Input should be greater than 0"),
        (CheckpointerConfig, "save_interval_steps", None, "Input should be a valid integer"),
        (CheckpointerConfig, "save_interval_steps", 2.5, "Input should be a valid integer"),
    ],
)
def test_a_bad_value_is_pydantics_validation_error_naming_the_field_and_the_value(cls, field, value, error):
    import pydantic

    with pytest.raises(pydantic.ValidationError) as raised:
        cls(**{"checkpoint_dir": "x", field: value})
    assert isinstance(raised.value, ValueError)
    (problem,) = raised.value.errors()
    assert problem["loc"][0] == field and problem["input"] == value
    assert f"1 validation error for {cls.__name__}\n{field}" in str(raised.value)
    assert error in str(raised.value)


def test_the_configs_coerce_as_pydantic_does_and_only_the_io_handlers_forbids_unknown_keys():
    import pydantic

    c = TrainingIOHandlerConfig(max_to_keep="3", keep_best="no", checkpoint_dir=pathlib.Path("/tmp/x"))  # pyright: ignore[reportArgumentType]  # pydantic's coercion under test
    assert c.max_to_keep == 3 and c.keep_best is False and c.checkpoint_dir == pathlib.Path("/tmp/x")
    with pytest.raises(pydantic.ValidationError, match=r"max_to_kep\n  Extra inputs are not permitted"):
        TrainingIOHandlerConfig(checkpoint_dir="x", max_to_kep=3)  # pyright: ignore[reportCallIssue]  # the refusal under test
    # CheckpointerConfig's model_config is only {'arbitrary_types_allowed': True}: pydantic's
    # default for unknown keys, ignore, holds for it
    ignored = CheckpointerConfig(checkpoint_dir="x", max_to_kep=3)  # pyright: ignore[reportCallIssue]  # the key ignored under test
    assert "max_to_kep" not in ignored.model_dump()
    with pytest.raises(ValueError, match='object has no field "keep_bset"'):
        TrainingIOHandlerConfig().keep_bset = False  # pyright: ignore[reportAttributeAccessIssue]  # the refusal under test
    coerced = CheckpointerConfig(checkpoint_dir="x", save_interval_steps="7")  # pyright: ignore[reportArgumentType]  # pydantic's coercion under test
    assert coerced.save_interval_steps == 7


def test_max_to_keep_none_is_accepted_by_the_checkpointer_config():
    assert CheckpointerConfig(checkpoint_dir="x", max_to_keep=None).max_to_keep is None


@pytest.mark.parametrize("restore", [{"restore_checkpoint_if_exists": True}, {"step_to_restore": 3}])
def test_clear_previous_checkpoints_can_not_be_set_to_true_if_one_selects_to_restore_a_checkpoint(restore):
    with pytest.raises(ValueError, match="clear_previous_checkpoints=True cannot be combined with a restore"):
        TrainingIOHandlerConfig(checkpoint_dir="x", clear_previous_checkpoints=True, **restore)


# --- Checkpointer ----------------------------------------------------------------------------------
def test_save_splits_the_state_across_params_opt_state_ema_params_and_extra_with_eval_loss_metrics(tmp_path):
    c = checkpointer(tmp_path)
    c.save(state_at(3), 3, 0.25)
    items = sorted(p.name for p in (tmp_path / "ckpt" / "3").iterdir() if p.is_dir())
    assert items == ["ema_params", "extra", "opt_state", "params"]
    meta = json.loads((tmp_path / "ckpt" / "3" / "_CHECKPOINT_METADATA").read_text())
    assert meta["custom_metadata"]["metrics"] == {"eval_loss": 0.25}


def test_the_scripted_retention_sequence_ends_with_the_two_lowest_losses_plus_the_newest(tmp_path):
    # max_to_keep=2, keep_best: after each save, the two lowest eval losses so far plus the
    # newest step (worked out by hand from the policy's sentence, step by step).
    losses = [5, 4, 3, 6, 7, 8, 2.5, 9, 9, 9]
    expected = [
        [1],
        [1, 2],
        [2, 3],
        [2, 3, 4],
        [2, 3, 5],
        [2, 3, 6],
        [3, 7],
        [3, 7, 8],
        [3, 7, 9],
        [3, 7, 10],
    ]
    c = checkpointer(tmp_path, max_to_keep=2, keep_best=True)
    for step, (loss, kept) in enumerate(zip(losses, expected, strict=True), start=1):
        c.save(state_at(step), step, loss)
        assert c.all_steps() == kept, step
    assert sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == [3, 7, 10]
    assert c.best_step() == 7 and c.latest_step() == 10


def test_keep_best_false_keeps_the_most_recent_max_to_keep(tmp_path):
    c = checkpointer(tmp_path, max_to_keep=2, keep_best=False)
    for step, loss in enumerate([5, 4, 3, 6, 7], start=1):
        c.save(state_at(step), step, loss)
    assert c.all_steps() == [4, 5] and c.best_step() == 4  # the best among those kept


def test_max_to_keep_none_disables_pruning_entirely(tmp_path):
    c = checkpointer(tmp_path, max_to_keep=None)
    for step in range(1, 8):
        c.save(state_at(step), step, 10.0 - step)
    assert c.all_steps() == list(range(1, 8))


def test_a_step_off_the_save_interval_is_skipped_except_the_first_save(tmp_path):
    c = Checkpointer(CheckpointerConfig(checkpoint_dir=str(tmp_path / "ckpt"), save_interval_steps=3))
    for step in range(1, 8):
        c.save(state_at(step), step, 1.0)
    assert c.all_steps() == [1, 3, 6]  # orbax's cadence: the initial save, then every 3 steps


def test_restore_returns_the_state_and_dataset_state_defaulting_to_the_latest(tmp_path):
    c = checkpointer(tmp_path)
    dataset = {
        "next_index": 17,
        "epoch": np.int64(2),
        "name": "train",
        "order": np.arange(5, dtype=np.uint32),
    }
    c.save(state_at(2), 2, 1.0, dataset_state={**dataset, "next_index": 9})
    c.save(state_at(4), 4, 2.0, dataset_state=dataset)
    fresh_dataset = {"next_index": 0, "epoch": np.int64(0), "name": "", "order": np.zeros(5, np.uint32)}
    state, restored = restored_pair(c, state_at(0), fresh_dataset)
    assert same(state, state_at(4)) and isinstance(state.params["w"], jax.Array)
    assert restored["next_index"] == 17 and restored["name"] == "train" and int(restored["epoch"]) == 2
    np.testing.assert_array_equal(restored["order"], np.arange(5))
    state, restored = restored_pair(c, state_at(0), fresh_dataset, step=2)
    assert int(state.step) == 2 and restored["next_index"] == 9
    assert restored_pair(c, state_at(0))[1] is None  # no dataset state asked for


def dataset_state_of_every_kind(step: int) -> dict:
    """Python scalars, a string, numpy scalars and arrays, JAX arrays: 0-d and not, nested."""
    return {
        "step": jnp.int32(step),
        "epoch": step // 2,
        "progress": step / 8,
        "shuffled": step % 2 == 1,
        "name": f"train-{step}",
        "seen": np.int64(10 * step),
        "fraction": np.float32(step / 4),
        "offset": np.asarray(step, np.int16),
        "order": np.arange(step, step + 5, dtype=np.uint32),
        "weights": jnp.arange(3.0) * step,
        "nested": [jnp.bool_(step > 1), ("shard", np.asarray([step], np.uint8))],
    }


def assert_round_trip(restored, saved) -> None:
    leaves, structure = jax.tree.flatten(saved)
    assert jax.tree.structure(restored) == structure
    for got, want in zip(jax.tree.leaves(restored), leaves, strict=True):
        assert type(got) is type(want) or (isinstance(want, jax.Array) and isinstance(got, jax.Array))
        if isinstance(want, jax.Array | np.ndarray | np.generic):
            assert got.dtype == want.dtype and np.shape(got) == np.shape(want)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        else:
            assert got == want


def test_a_dataset_state_of_scalars_strings_numpy_and_jax_arrays_comes_back_equal_with_its_types(tmp_path):
    c = checkpointer(tmp_path)
    c.save(state_at(3), 3, 1.0, dataset_state=dataset_state_of_every_kind(3))
    state, restored = restored_pair(c, state_at(0), dataset_state_of_every_kind(0))
    assert int(state.step) == 3
    assert_round_trip(restored, dataset_state_of_every_kind(3))
    assert restored["step"].sharding == jnp.int32(0).sharding  # placed as the template's leaf

    handler = TrainingIOHandler(
        {
            "checkpoint_dir": str(tmp_path / "h"),
            "save_interval_steps": 1,
            "restore_checkpoint_if_exists": True,
        }
    )
    handler.save_checkpoint(state_at(5), 5, 1.0, dataset_state={"step": jnp.int32(5)})
    handler.wait_until_finished()
    _, restored = handler.restore_checkpoint(state_at(0), {"step": jnp.int32(0)})
    assert_round_trip(restored, {"step": jnp.int32(5)})


def test_restore_gives_none_for_the_dataset_state_when_the_checkpoint_holds_none(tmp_path):
    c = checkpointer(tmp_path)
    c.save(state_at(1), 1, 1.0)
    assert restored_pair(c, state_at(0), {"next_index": 0})[1] is None


def test_restore_optimizer_state_and_rng_key_false_reset_to_the_training_states(tmp_path):
    c = checkpointer(tmp_path)
    c.save(state_at(5), 5, 1.0)
    fresh = state_at(0)
    for path in (tmp_path / "ckpt" / "5" / "opt_state").rglob("*"):
        if path.is_file() and path.parent.name == "d":
            path.write_bytes(b"garbage")  # with restore_optimizer_state=False it is never read
    state, _ = restored_pair(c, fresh, restore_optimizer_state=False, restore_rng_key=False)
    assert same(state.opt_state, fresh.opt_state) and same(state.rng, fresh.rng)
    assert same(state.params, state_at(5).params) and int(state.step) == 5


def test_restore_returns_none_if_no_checkpoint_exists(tmp_path):
    c = checkpointer(tmp_path)
    assert c.restore(state_at(0)) is None
    assert c.latest_step() is None and c.best_step() is None


def test_restore_raises_value_error_if_the_restored_num_steps_disagrees_with_the_metadata(tmp_path):
    c = checkpointer(tmp_path)
    c.save(state_at(2), 2, 1.0)
    meta_path = tmp_path / "ckpt" / "2" / "_CHECKPOINT_METADATA"
    meta = json.loads(meta_path.read_text())
    meta["custom_metadata"]["num_steps"] = 3
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="restored state is at step 2, its metadata records step 3"):
        checkpointer(tmp_path).restore(state_at(0))
    meta["custom_metadata"].update(num_steps=2, step=3)  # the key recorded is not the step's
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="records step 2 under key 3"):
        checkpointer(tmp_path).restore(state_at(0))


def test_restore_ema_reads_only_ema_params_and_extra_and_applies_the_bias_correction(tmp_path):
    c = checkpointer(tmp_path)
    c.save(state_at(3), 3, 1.0, ema_decay=0.9)
    for item in ("params", "opt_state"):  # an EMA-only export: what restore_ema never reads is gone
        shutil.rmtree(tmp_path / "ckpt" / "3" / item)
    template = jax.eval_shape(lambda: state_at(0).params)
    ema = c.restore_ema(template)
    np.testing.assert_allclose(ema["w"], 0.5 * 3.0 / (1 - 0.9**3), rtol=1e-6)
    np.testing.assert_allclose(ema["b"], get_debiased_ema(state_at(3).ema, 0.9, 3)["b"], rtol=1e-6)
    with pytest.raises(ValueError, match="contradicts the EMA"):  # the recorded decay is the truth
        c.restore_ema(None, step=3, decay=0.5)
    c.save(state_at(4), 4, 1.0)  # saved without a decay: the default law is recorded, as assumed
    # float32: 4 roundings in 0.999**4 and 4 more in the product and division, each <= 2**-24,
    # amplified by the cancellation in 1 - 0.999**4
    rtol = 8 * 2**-24 / (1 - 0.999**4)
    np.testing.assert_allclose(c.restore_ema(None, step=4)["w"], 2.0 / (1 - 0.999**4), rtol=rtol)
    np.testing.assert_allclose(c.restore_ema(None, step=4, decay=0.5)["w"], 2.0 / (1 - 0.5**4), rtol=1e-6)


def test_restore_ema_raises_value_error_if_no_checkpoint_exists(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint in"):
        checkpointer(tmp_path).restore_ema(None)


def test_wait_until_finished_blocks_until_pending_asynchronous_saves_complete(tmp_path):
    c = checkpointer(tmp_path, enable_async_checkpointing=True)
    c.save(state_at(1), 1, 1.0)
    c.wait_until_finished()
    assert (tmp_path / "ckpt" / "1" / "_CHECKPOINT_METADATA").is_file()
    with pytest.raises(Exception, match="step 1 was not written"):  # the same step twice: refused
        c.save(state_at(1), 1, 1.0)  # at once, before anything is queued
    c.wait_until_finished()  # nothing is pending and nothing failed


# --- TrainingIOHandler -----------------------------------------------------------------------------
def test_save_interval_steps_none_disables_checkpointing(tmp_path):
    handler = TrainingIOHandler(TrainingIOHandlerConfig(checkpoint_dir=str(tmp_path / "c")))
    handler.save_checkpoint(state_at(1), 1, 1.0)
    handler.wait_until_finished()
    assert not (tmp_path / "c").exists()
    assert TrainingIOHandler().checkpointer is None  # config=None: the defaults


def test_restore_requested_but_checkpointing_disabled_raises_checkpoint_restoration_error(tmp_path):
    handler = TrainingIOHandler(
        TrainingIOHandlerConfig(checkpoint_dir=str(tmp_path / "c"), restore_checkpoint_if_exists=True)
    )
    with pytest.raises(CheckpointRestorationError, match="checkpointing is disabled"):
        handler.restore_checkpoint(state_at(0))


def test_restore_checkpoint_returns_the_inputs_unchanged_if_no_checkpoint_exists(tmp_path):
    fresh, dataset = state_at(0), {"next_index": 0}
    config = {
        "checkpoint_dir": str(tmp_path / "c"),
        "save_interval_steps": 1,
        "restore_checkpoint_if_exists": True,
    }
    handler = TrainingIOHandler(config)
    state, restored = handler.restore_checkpoint(fresh, dataset)
    assert state is fresh and restored is dataset
    not_requested = TrainingIOHandler({**config, "restore_checkpoint_if_exists": False})
    not_requested.save_checkpoint(state_at(2), 2, 1.0)
    assert not_requested.restore_checkpoint(fresh)[0] is fresh  # no restore was asked for


def test_save_checkpoint_then_restore_checkpoint_resumes_the_latest_and_tells_the_loggers(tmp_path):
    uploads = []

    def upload(path):
        uploads.append(os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA")))
        future = concurrent.futures.Future()
        future.set_result(None)
        return future

    config = TrainingIOHandlerConfig(
        checkpoint_dir=str(tmp_path / "c"), save_interval_steps=2, enable_async_checkpointing=True
    )
    handler = TrainingIOHandler(config, data_upload_fn=upload)
    seen = []
    handler.attach_logger(lambda category, to_log, step: seen.append((category, dict(to_log), step)))
    for step, loss in [(1, 0.9), (2, 0.5), (3, 0.1), (4, 0.7), (6, 0.2)]:
        handler.save_checkpoint(state_at(step), step, loss)
    handler.wait_until_finished()
    assert uploads == [True, True, True, True]  # steps 1 (the initial save), 2, 4, 6; each after it landed
    best = [(to_log, step) for category, to_log, step in seen if category is LoggingCategory.BEST_MODEL]
    assert best == [
        ({"step": 1, "eval_loss": 0.9}, 1),
        ({"step": 2, "eval_loss": 0.5}, 2),
        ({"step": 6, "eval_loss": 0.2}, 6),
    ]

    resumed = TrainingIOHandler(
        TrainingIOHandlerConfig(
            checkpoint_dir=str(tmp_path / "c"), save_interval_steps=2, restore_checkpoint_if_exists=True
        )
    )
    resumed.attach_logger(lambda category, to_log, step: seen.append((category, dict(to_log), step)))
    state, dataset = resumed.restore_checkpoint(state_at(0))
    assert same(state, state_at(6)) and dataset is None
    assert seen[-1] == (LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION, {}, 6)


def test_config_restore_optimizer_state_false_keeps_the_fresh_optimizer_state(tmp_path):
    base = {"checkpoint_dir": str(tmp_path / "c"), "save_interval_steps": 1}
    TrainingIOHandler(base).save_checkpoint(state_at(3), 3, 1.0)
    handler = TrainingIOHandler(
        {**base, "restore_checkpoint_if_exists": True, "restore_optimizer_state": False}
    )
    state, _ = handler.restore_checkpoint(state_at(0))
    assert same(state.opt_state, state_at(0).opt_state) and same(state.params, state_at(3).params)


def test_restore_dir_is_read_and_defaults_to_checkpoint_dir(tmp_path):
    TrainingIOHandler({"checkpoint_dir": str(tmp_path / "a"), "save_interval_steps": 1}).save_checkpoint(
        state_at(4), 4, 1.0
    )
    handler = TrainingIOHandler(
        {
            "checkpoint_dir": str(tmp_path / "b"),
            "restore_dir": str(tmp_path / "a"),
            "save_interval_steps": 1,
            "restore_checkpoint_if_exists": True,
        }
    )
    state, _ = handler.restore_checkpoint(state_at(0))
    assert int(state.step) == 4
    handler.save_checkpoint(state_at(5), 5, 1.0)
    handler.wait_until_finished()
    assert sorted(os.listdir(tmp_path / "a")) == ["4"] and "5" in os.listdir(tmp_path / "b")


def test_clear_previous_checkpoints_deletes_the_checkpoints_in_checkpoint_dir(tmp_path):
    base = {"checkpoint_dir": str(tmp_path / "c"), "save_interval_steps": 1}
    TrainingIOHandler(base).save_checkpoint(state_at(1), 1, 1.0)
    handler = TrainingIOHandler({**base, "clear_previous_checkpoints": True})
    assert handler.checkpointer is not None and handler.checkpointer.latest_step() is None


def test_step_to_restore_older_than_the_latest_rolls_back_and_training_continues(tmp_path):
    base = {"checkpoint_dir": str(tmp_path / "c"), "save_interval_steps": 2, "max_to_keep": 5}
    first = TrainingIOHandler(base)
    for step in (2, 4, 6):
        first.save_checkpoint(state_at(step), step, 1.0)
    handler = TrainingIOHandler({**base, "step_to_restore": 2})
    state, _ = handler.restore_checkpoint(state_at(0))
    assert int(state.step) == 2
    for step in (4, 6, 8):  # the steps the abandoned continuation had saved are written again
        handler.save_checkpoint(state_at(step), step, 0.5)
    handler.wait_until_finished()
    assert handler.checkpointer is not None and handler.checkpointer.all_steps() == [2, 4, 6, 8]
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("c.rolled-back-")]
    assert sorted(os.listdir(aside)) == ["4", "6"]  # moved aside, not silently kept or lost


# --- logging ---------------------------------------------------------------------------------------
def test_logging_category_has_the_documented_members():
    assert [c.name for c in LoggingCategory] == [
        "BEST_MODEL",
        "TRAIN_METRICS",
        "EVAL_METRICS",
        "TEST_METRICS",
        "SYSTEM_METRICS",
        "CLEANUP_AFTER_CKPT_RESTORATION",
    ]


def test_log_calls_every_attached_logger_with_category_data_and_step():
    handler = TrainingIOHandler()
    calls = []
    handler.attach_logger(lambda *a: calls.append(("a", *a)))
    handler.attach_logger(lambda *a: calls.append(("b", *a)))
    handler.log(LoggingCategory.TRAIN_METRICS, {"loss": 1.0}, 7)
    assert calls == [
        ("a", LoggingCategory.TRAIN_METRICS, {"loss": 1.0}, 7),
        ("b", LoggingCategory.TRAIN_METRICS, {"loss": 1.0}, 7),
    ]


def test_convert_mse_to_rmse_in_logs_takes_the_square_root_of_mse_entries():
    out = convert_mse_to_rmse_in_logs({"mse_x": 4.0, "loss": 2.0, "eval_mse_y": np.float32(9.0)})
    assert out == {"rmse_x": 2.0, "loss": 2.0, "eval_rmse_y": 3.0}
    # after averaging: the root of the mean of 1 and 9 is sqrt(5), not the mean of roots (2)
    assert math.isclose(convert_mse_to_rmse_in_logs({"mse_a": np.mean([1.0, 9.0])})["rmse_a"], math.sqrt(5))


def test_log_metrics_to_line_and_to_table_print_rmse_for_mse(capsys):
    log_metrics_to_line(LoggingCategory.EVAL_METRICS, {"mse_x": 4.0, "loss": 0.5}, 3)
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "rmse_x=2" in line and "mse_x=4" not in line and "step 3" in line
    log_metrics_to_table(LoggingCategory.TRAIN_METRICS, {"mse_x": 4.0, "loss": 0.5}, 3)
    table = capsys.readouterr().out
    assert "| rmse_x" in table and "| loss" in table and "mse_x " not in table.replace("rmse_x", "")


def test_get_debiased_ema_divides_by_one_minus_decay_to_the_num_updates():
    ema = {"w": jnp.array([0.19, 0.38])}  # two updates of 0.9 from zero towards 1 and 2
    np.testing.assert_allclose(get_debiased_ema(ema, 0.9, 2)["w"], [1.0, 2.0], rtol=1e-6)
    with pytest.raises(ValueError, match="num_updates must be >= 1"):
        get_debiased_ema(ema, 0.9, 0)


def test_run_metadata_is_json_at_the_run_root_and_none_when_absent(tmp_path):
    assert read_run_metadata(str(tmp_path)) is None
    save_run_metadata(str(tmp_path), {"config": {"lr": 0.1}, "label": "a"})
    assert read_run_metadata(str(tmp_path)) == {"config": {"lr": 0.1}, "label": "a"}
    assert sorted(os.listdir(tmp_path)) == ["run.json"]


# --- a loop written from the stix text alone ---------------------------------------------------------
def test_a_training_loop_written_from_the_stix_text_runs_and_resumes(tmp_path):
    def train(handler: TrainingIOHandler, state: TrainState, until: int) -> TrainState:
        state, _ = handler.restore_checkpoint(state)
        for step in range(int(state.step) + 1, until + 1):
            state = state.replace(step=jnp.int32(step), params=jax.tree.map(lambda p: p + 1, state.params))
            metrics = {"mse_fit": 0.25}
            handler.log(LoggingCategory.TRAIN_METRICS, metrics, step)
            handler.save_checkpoint(state, step, eval_loss=1.0 / step)
        handler.wait_until_finished()
        return state

    config = TrainingIOHandler.Config(
        checkpoint_dir=str(tmp_path / "run" / "checkpoints"),
        save_interval_steps=2,
        max_to_keep=2,
        restore_checkpoint_if_exists=True,
    )
    lines = []
    handler = TrainingIOHandler(config)
    handler.attach_logger(lambda c, d, s: lines.append((s, convert_mse_to_rmse_in_logs(d))))
    first = train(handler, state_at(0), 4)
    resumed = train(TrainingIOHandler(config), state_at(0), 6)
    straight = train(
        TrainingIOHandler(config.model_dump() | {"checkpoint_dir": str(tmp_path / "s")}), state_at(0), 6
    )
    assert int(first.step) == 4 and same(resumed, straight)
    assert lines[0] == (1, {"rmse_fit": 0.5})
