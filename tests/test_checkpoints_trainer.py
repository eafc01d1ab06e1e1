"""``config.checkpoint`` through the Trainer: validation, restore flags, a separate restore
directory, a specific step, clearing; and the checkpoint stage's local cadence."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from dew.config import ConfigError
from dew.data.dataset import Dataset, Source
from dew.training.checkpointing import CheckpointRestorationError, Checkpoints
from dew.training.checkpointing.settings import checkpoint_settings
from dew.training.loop import fit
from dew.training.stages import CheckpointStage
from dew.training.state import TrainState
from dew.training.trainer import Trainer, validate_config

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
        ({"checkpoint.keep": 0}, r"checkpoint.keep=0 is invalid: expected an int >= 1"),
        ({"checkpoint.restore_dir": ""}, "restore_dir='' is invalid"),
    ],
)
def test_bad_checkpoint_settings_stop_before_any_work(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(tiny_config(**overrides))


def test_unknown_and_mistyped_keys_are_named():
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) config.checkpoint.\['max_to_keep'\]"):
        checkpoint_settings({"every": 1, "max_to_keep": 3})
    with pytest.raises(ConfigError, match="restore_rng_key='yes' is invalid: expected a bool"):
        checkpoint_settings({"restore_rng_key": "yes"})
    assert checkpoint_settings({}).restore_checkpoint_if_exists  # a config without the new keys


def saved_run(tmp_path) -> tuple[Trainer, TrainState, TrainState]:
    """A Trainer's fresh state and a different one saved at step 2 with a data position."""
    trainer = Trainer(tiny_config(), str(tmp_path / "a"))
    fresh = trainer.init(jax.random.PRNGKey(0), trainer.example_batch())
    bump = lambda tree: jax.tree.map(lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)  # noqa: E731
    saved = fresh.replace(
        step=jnp.int32(2), params=bump(fresh.params), opt_state=bump(fresh.opt_state), rng=fresh.rng + 1
    )
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

    missing = Trainer(tiny_config(**{"checkpoint.step_to_restore": 5}), str(tmp_path / "a"))
    with pytest.raises(
        CheckpointRestorationError, match=r"no checkpoint for step 5 .* stored steps are \[2\]"
    ):
        missing.initial_state()


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
    assert clear.checkpoints.latest is None


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
    from dew.training.loop import Stage
    from dew.training.trackers import LoggingCategory, Trackers

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
