"""Gradient accumulation: k micro-batches equal one big batch, and a checkpoint taken
mid-accumulation (pending sums in TrainState) resumes exactly."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from helpers_common import tiny_config
from helpers_trainer import Regression, regression_batches
from test_training import assert_states_identical

from dew.objectives.base import EMASpec
from dew.training.steps import make_init, make_step
from dew.training.trainer import Trainer


def test_k_micro_batches_give_the_update_of_one_big_batch():
    objective, optimizer, ema = Regression(), optax.adam(1e-2), EMASpec(decay=0.9)
    big = regression_batches(16, 3)
    key = jax.random.PRNGKey(0)

    whole_init = jax.jit(make_init(objective, optimizer, ema))
    whole_step = jax.jit(make_step(objective, optimizer, ema))
    whole = whole_init(key, big[0])
    for batch in big:
        whole, _ = whole_step(whole, batch)

    k = 4
    micro_init = jax.jit(make_init(objective, optimizer, ema, accumulation=k))
    micro_step = jax.jit(make_step(objective, optimizer, ema, accumulation=k))
    micro = micro_init(key, {n: v[:4] for n, v in big[0].items()})
    for batch in big:
        for i in range(k):
            micro, _ = micro_step(micro, {n: v[i * 4 : (i + 1) * 4] for n, v in batch.items()})
            if i < k - 1:  # mid-accumulation: nothing applied yet, the sums are pending
                assert float(optax.tree.norm(micro.pending["grads"])) > 0

    assert int(micro.step) == 12 and int(whole.step) == 3
    for name in ("params", "opt_state", "ema"):
        for a, b in zip(
            jax.tree.leaves(getattr(micro, name)), jax.tree.leaves(getattr(whole, name)), strict=True
        ):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=name)
    assert all(float(np.max(np.abs(g))) == 0 for g in jax.tree.leaves(micro.pending["grads"]))


def test_a_checkpoint_mid_accumulation_resumes_exactly(tmp_path):
    overrides = {  # no previews: what is resumed here does not depend on them (one sampler compile less)
        "train.accumulation": 2,
        "eval.every": 0,
        "preview.every": 0,
        "checkpoint.every": 3,
        "dataset.batch_size": 8,
    }
    straight = Trainer(tiny_config(**overrides, **{"train.num_steps": 6}), str(tmp_path / "straight")).run()

    interrupted = tmp_path / "interrupted"
    first = Trainer(tiny_config(**overrides, **{"train.num_steps": 3}), str(interrupted)).run()
    assert int(first.step) == 3  # one update applied, the second half-accumulated
    assert first.pending is not None and float(optax.tree.norm(first.pending["grads"])) > 0
    resumed_trainer = Trainer(tiny_config(**overrides, **{"train.num_steps": 6}), str(interrupted))
    assert resumed_trainer.checkpoints is not None and resumed_trainer.checkpoints.latest == 3
    resumed = resumed_trainer.run()

    assert_states_identical(straight, resumed)
    for a, b in zip(jax.tree.leaves(straight.pending), jax.tree.leaves(resumed.pending), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_accumulation_must_be_a_positive_int():
    with pytest.raises(ValueError, match="accumulation must be an int >= 1"):
        make_step(Regression(), optax.sgd(0.1), EMASpec(), accumulation=0)
