"""``config.checkpoint`` through the Trainer: validation, restore flags, a separate restore
directory, a specific step, clearing; and the checkpoint stage's local cadence."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import tiny_config

from dew.checkpointing import CheckpointRestorationError, Checkpoints
from dew.checkpointing.settings import checkpoint_settings
from dew.config import ConfigError
from dew.data.dataset import Dataset, Source
from dew.training.loop import fit
from dew.training.stages import CheckpointStage
from dew.training.state import TrainState
from dew.training.trainer import Trainer, resolve_config

POSITION = b'{"batch": 5, "epoch": 2}'


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"checkpoint.clear_previous_checkpoints": True}, "cannot be combined with a restore"),
        (
            {
                "checkpoint.clear_previous_checkpoints": True,
                "checkpoint.restore_checkpoint_if_exists": False,
                "checkpoint.step_to_restore": 3,
            },
            "cannot be combined with a restore",
        ),
        (
            {"checkpoint.step_to_restore": 0},
            r"checkpoint.step_to_restore=0 is invalid: expected None \(the latest\)",
        ),
        ({"checkpoint.local_every": 2}, "local_directory and config.checkpoint.local_every go together"),
        (
            {"checkpoint.keep": 0},
            r"checkpoint.keep=0 is invalid: expected None \(keep every step\) or an int",
        ),
        ({"checkpoint.restore_dir": ""}, "restore_dir='' is invalid"),
        (
            {"checkpoint.on_rollback": "keep"},
            r"on_rollback='keep' is invalid: expected \"move\" or \"delete\"",
        ),
        (
            {"checkpoint.directory": "foo://b/run"},
            "config.checkpoint.directory 'foo://b/run' has the URI scheme foo://",
        ),
        (
            {"checkpoint.every": 0, "checkpoint.step_to_restore": 2},
            "checkpoint.every=0 turns checkpointing off, but a restore is requested",
        ),
    ],
)
def test_bad_checkpoint_settings_stop_before_any_work(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(tiny_config(**overrides))


def test_a_restore_request_with_checkpointing_off_is_a_checkpoint_restoration_error():
    with pytest.raises(CheckpointRestorationError, match="turns checkpointing off"):
        resolve_config(tiny_config(**{"checkpoint.every": 0, "checkpoint.restore_dir": "/x"}))


def test_unknown_and_mistyped_keys_are_named():
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) config.checkpoint.\['max_to_keep'\]"):
        checkpoint_settings({"every": 1, "max_to_keep": 3})
    with pytest.raises(ConfigError, match="restore_rng_key='yes' is invalid: expected a bool"):
        checkpoint_settings({"restore_rng_key": "yes"})
    assert checkpoint_settings({}).restore_checkpoint_if_exists  # a config without the new keys


def saved_run(tmp_path) -> tuple[Trainer, TrainState, TrainState]:
    """A Trainer's fresh state and a different one saved at step 2 with a data position."""
    trainer = Trainer(tiny_config(), str(tmp_path / "a"))
    fresh = trainer.programs.init(jax.random.PRNGKey(0), trainer.example_batch())
    bump = lambda tree: jax.tree.map(lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)  # noqa: E731
    saved = fresh.replace(
        step=jnp.int32(2), params=bump(fresh.params), opt_state=bump(fresh.opt_state), rng=fresh.rng + 1
    )
    assert trainer.checkpoints is not None
    trainer.checkpoints.save(2, saved, POSITION, share=trainer.train_data.share)
    trainer.checkpoints.wait()
    return trainer, fresh, saved


def equal(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_restore_flags_a_restore_directory_and_a_specific_step(tmp_path):
    _, fresh, saved = saved_run(tmp_path)

    resumed = Trainer(tiny_config(), str(tmp_path / "a"))
    state = resumed.initial_state()
    assert int(state.step) == 2 and equal(state.opt_state, saved.opt_state) and equal(state.rng, saved.rng)
    assert resumed.train_data.save_position() == POSITION

    other = Trainer(
        tiny_config(
            **{
                "checkpoint.restore_dir": str(tmp_path / "a" / "checkpoints"),
                "checkpoint.step_to_restore": 2,
                "checkpoint.restore_optimizer_state": False,
                "checkpoint.restore_rng_key": False,
            }
        ),
        str(tmp_path / "b"),
    )
    state = other.initial_state()
    assert int(state.step) == 2 and equal(state.params, saved.params) and equal(state.ema, saved.ema)
    assert equal(state.opt_state, fresh.opt_state) and equal(state.rng, fresh.rng)
    assert other.train_data.save_position() == POSITION

    # A step that is not stored is refused when the Trainer is built, before the platform starts.
    with pytest.raises(
        ConfigError,
        match=r"step_to_restore=5 is invalid: .* no checkpoint for step 5 \(its steps are \[2\]\)",
    ):
        Trainer(tiny_config(**{"checkpoint.step_to_restore": 5}), str(tmp_path / "a"))


def test_a_run_that_does_not_restore_refuses_old_checkpoints_unless_it_clears_them(tmp_path):
    saved_run(tmp_path)
    refuse = Trainer(tiny_config(**{"checkpoint.restore_checkpoint_if_exists": False}), str(tmp_path / "a"))
    with pytest.raises(CheckpointRestorationError, match=r"already holds checkpoints .*latest step 2"):
        refuse.initial_state()
    clear = Trainer(
        tiny_config(
            **{
                "checkpoint.restore_checkpoint_if_exists": False,
                "checkpoint.clear_previous_checkpoints": True,
            }
        ),
        str(tmp_path / "a"),
    )
    assert int(clear.initial_state().step) == 0
    assert clear.checkpoints is not None and clear.checkpoints.latest is None


def counting_run():
    """A 12-example stream, a three-parameter state and a step that adds each batch's sum."""
    data = Dataset(Source("n", {"x": np.arange(12, dtype=np.float32)[:, None]}), 2)
    state = TrainState(
        step=jnp.int32(0),
        params={"w": jnp.zeros(3)},
        opt_state=(),
        ema={"w": jnp.zeros(3)},
        rng=jnp.zeros(2, jnp.uint32),
    )

    def step(s, batch):
        return s.replace(step=s.step + 1, params={"w": s.params["w"] + batch["x"].sum()}), {}

    return data, state, jax.jit(step)


def test_the_checkpoint_stage_writes_local_steps_between_persistent_ones(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"), local_directory=str(tmp_path / "local"), local_every=1)
    data, state, step = counting_run()

    fit(state, step, iter(data), 7, [CheckpointStage(checkpoints, data, every=4)])
    assert checkpoints.all_steps() == [4, 7] and checkpoints.local_step() == 6 and checkpoints.latest == 7
    restored, position = checkpoints.restore(None, 6, share=data.share)
    assert int(restored.step) == 6 and position == b'{"batch": 0, "epoch": 1}'


def test_the_checkpoint_stage_reports_each_new_best_to_the_trackers_also_across_a_resume(tmp_path):
    from dew.tracking.trackers import LoggingCategory, Trackers
    from dew.training.loop import Stage

    data, state, step = counting_run()

    class ScriptedEvalLoss(Stage):  # what EvalStage reports, scripted per step
        every = 1

        def __init__(self, losses):
            self.losses = losses

        def run(self, ctx):
            ctx.reports["eval_loss"] = self.losses[ctx.step]

    best = []
    trackers = Trackers(
        [lambda category, values, step: best.append(step) if category is LoggingCategory.BEST_MODEL else None]
    )
    checkpoints = Checkpoints(str(tmp_path / "c"), keep=1)
    losses = {1: 0.9, 2: 0.5, 3: 0.7, 4: 0.4, 5: 0.6, 6: 0.45, 7: 0.3}
    stages = [ScriptedEvalLoss(losses), CheckpointStage(checkpoints, data, every=1, tracker=trackers)]
    first = fit(state, step, iter(data), 5, stages)
    assert best == [1, 2, 4]
    # A resumed run compares against the best already on disk (0.4 at step 4), not from scratch.
    stages = [ScriptedEvalLoss(losses), CheckpointStage(checkpoints, data, every=1, tracker=trackers)]
    fit(first, step, iter(data), 7, stages)
    assert best == [1, 2, 4, 7]
    assert checkpoints.best == 7


def scalars(workdir) -> list[tuple[str, int]]:
    import json

    path = workdir / "tracking" / "scalars.jsonl"
    return [(r["category"], r["step"]) for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.slow
def test_rolling_back_from_6_to_2_then_training_to_8_continues_with_one_history(tmp_path):
    base = {
        "train.num_steps": 6,
        "train.log_every": 1,
        "checkpoint.every": 2,
        "checkpoint.keep": 5,
        "eval.every": 0,
        "preview.every": 0,
    }
    Trainer(tiny_config(**base), str(tmp_path)).run()
    assert Checkpoints(str(tmp_path / "checkpoints")).all_steps() == [2, 4, 6]

    rolled = Trainer(
        tiny_config(**{**base, "train.num_steps": 8, "checkpoint.step_to_restore": 2}), str(tmp_path)
    )
    state = rolled.run()  # no error when the run reaches steps 4 and 6 again
    assert int(state.step) == 8 and rolled.restored_step == 2
    assert rolled.checkpoints is not None and rolled.checkpoints.all_steps() == [2, 4, 6, 8]
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("checkpoints.rolled-back-")]
    assert sorted(os.listdir(aside)) == ["4", "6"]  # the abandoned continuation, kept aside
    train = [step for category, step in scalars(tmp_path) if category == "train"]
    assert train == [1, 2, 3, 4, 5, 6, 7, 8]  # 1-2, then 3-8 once each: 3-6 of the first run discarded


@pytest.mark.slow
def test_checkpointing_off_writes_no_checkpoints_and_a_file_uri_directory_round_trips(tmp_path):
    off = Trainer(
        tiny_config(**{"checkpoint.every": 0, "train.num_steps": 2, "eval.every": 0, "preview.every": 0}),
        str(tmp_path / "a"),
    )
    assert off.checkpoints is None
    off.run()
    assert not (tmp_path / "a" / "checkpoints").exists()

    uri = (tmp_path / "elsewhere").as_uri()
    config = {
        "checkpoint.directory": uri,
        "train.num_steps": 2,
        "checkpoint.every": 2,
        "eval.every": 0,
        "preview.every": 0,
    }
    Trainer(tiny_config(**config), str(tmp_path / "b")).run()
    assert (
        sorted(os.listdir(tmp_path / "elsewhere")) == ["2"] and not (tmp_path / "b" / "checkpoints").exists()
    )
    resumed = Trainer(tiny_config(**{**config, "train.num_steps": 4}), str(tmp_path / "b"))
    assert int(resumed.initial_state().step) == 2 and resumed.restored_step == 2
