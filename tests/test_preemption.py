"""SIGTERM and Ctrl-C during ``fit``: the current step is saved and waited for, the run stops
with ``Preempted`` saying where to resume, and the resumed run ends bit-identical to a straight
one. (Through ``python -m dew.main``: tests/system/test_checkpoints_cli.py.)"""

from __future__ import annotations

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.checkpointing import Checkpoints
from dew.data.dataset import Dataset, Source
from dew.training.loop import Stage, StepContext, fit
from dew.training.preemption import Preempted, PreemptionStage
from dew.training.stages import CheckpointStage
from dew.training.state import TrainState


def run_parts():
    data = Dataset(Source("n", {"x": np.arange(40, dtype=np.float32)[:, None]}), 2, seed=1)
    state = TrainState(
        step=jnp.int32(0),
        params={"w": jnp.zeros(3)},
        opt_state=(),
        ema={"w": jnp.zeros(3)},
        rng=jax.random.PRNGKey(0),
    )

    def step(s, batch):
        rng, noise = jax.random.split(s.rng)
        w = s.params["w"] * 0.5 + batch["x"].sum() + jax.random.normal(noise, (3,))
        return s.replace(step=s.step + 1, params={"w": w}, rng=rng), {}

    return data, state, jax.jit(step)


class SignalAt(Stage):
    """Sends ``signum`` to this process during step ``at`` (as a scheduler would, mid-interval)."""

    every = 0

    def __init__(self, at: int, signum: int):
        self.at, self.signum = at, signum

    def observe(self, ctx: StepContext) -> None:
        if ctx.step == self.at:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_interval_saves_that_step_and_the_resumed_run_is_bit_identical(tmp_path, signum, code):
    data, state, step = run_parts()
    straight = fit(state, step, iter(data), 12, [])

    checkpoints = Checkpoints(str(tmp_path / "c"), keep=2)
    data, state, step = run_parts()
    before = signal.getsignal(signum)
    stages = [
        SignalAt(5, signum),
        CheckpointStage(checkpoints, data, every=4),
        PreemptionStage(checkpoints, data),
    ]
    with pytest.raises(Preempted) as stopped:
        fit(state, step, iter(data), 12, stages)
    assert signal.getsignal(signum) is before  # handlers restored
    assert stopped.value.step == 5 and stopped.value.exit_code == code
    assert str(stopped.value).startswith(f"preempted by {signal.Signals(signum).name} at step 5")
    assert "run the same command again to resume" in str(stopped.value)
    assert checkpoints.all_steps() == [4, 5]  # step 5 landed although it is off the save cadence

    data, fresh, step = run_parts()
    resumed_state, position = Checkpoints(str(tmp_path / "c")).resume(fresh, share=data.share)
    assert position is not None
    data.read_position(position)
    assert int(resumed_state.step) == 5  # from the step it was at, not the last periodic save (4)
    resumed = fit(resumed_state, step, iter(data), 12, [])
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_without_a_checkpointer_a_signal_stops_the_run_saying_nothing_was_saved():
    data, state, step = run_parts()
    with pytest.raises(Preempted, match="nothing was saved: checkpointing is off") as stopped:
        fit(state, step, iter(data), 12, [SignalAt(3, signal.SIGTERM), PreemptionStage(None, data)])
    assert stopped.value.path is None and stopped.value.step == 3


class Killed(BaseException):
    """A SIGKILL, as far as the loop can tell: nothing after it runs."""


class ScriptedEvalLoss(Stage):
    """What the evaluation stage reports, scripted: a loss that falls every step."""

    every = 1

    def run(self, ctx: StepContext) -> None:
        ctx.reports["eval_loss"] = 1.0 / ctx.step


@pytest.mark.parametrize("kill", ["just after step 4 landed", "just before step 4 was written"])
def test_a_kill_at_a_best_checkpoint_leaves_its_best_model_row_only_with_the_step(
    tmp_path, monkeypatch, kill
):
    """A kill right after a best checkpoint's rename once lost its ``best_model`` row for good
    (the resume starts at that step, and no later step beats it); the row is now written first,
    and a kill before the step lands leaves a row the restart's cleanup removes."""
    from dew.tracking.base import LoggingCategory
    from dew.tracking.local import LocalTracker, read_rows

    data, state, step = run_parts()
    checkpoints = Checkpoints(str(tmp_path / "c"), keep=2, asynchronous=False)
    tracker = LocalTracker(str(tmp_path / "tracking"))
    save = checkpoints.save

    def killed_at_4(at, *args, **kwargs):
        if at == 4 and kill.endswith("written"):
            raise Killed
        save(at, *args, **kwargs)
        checkpoints.wait()
        if at == 4:
            raise Killed

    monkeypatch.setattr(checkpoints, "save", killed_at_4)
    with pytest.raises(Killed):
        fit(state, step, iter(data), 12, [ScriptedEvalLoss(), CheckpointStage(checkpoints, data, 2, tracker)])
    tracker.close()
    resumed_from = checkpoints.latest
    assert resumed_from == (4 if kill.endswith("landed") else 2)
    restarted = LocalTracker(str(tmp_path / "tracking"))  # what the restart's trackers do first
    restarted.log(LoggingCategory.CLEANUP_AFTER_CKPT_RESTORATION, {}, resumed_from)
    rows, _ = read_rows(restarted.scalars_path)
    best = [row["step"] for _, row in rows if row["category"] == "best_model"]
    assert best == [2, 4] if kill.endswith("landed") else best == [2]
    assert checkpoints.best_step() == best[-1]
