"""Post-hoc EMA in a run: power-EMA slots in the pure step, snapshots, ``python -m dew.phema``."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from dew.averaging import posthoc as posthoc_ema
from dew.averaging.power_ema import PowerEMA, PowerEMASnapshots


def _trained(tmp_path, **overrides):
    from helpers_common import tiny_config

    from dew.training.trainer import Trainer

    config = tiny_config(
        # No previews: the power-EMA slots and snapshots do not depend on them (one sampler compile less).
        **{
            "ema.power_std_rels": (0.05, 0.1),
            "ema.snapshot_every": 2,
            "eval.every": 0,
            "preview.every": 0,
            **overrides,
        }
    )
    trainer = Trainer(config, str(tmp_path / "run"))
    return trainer, trainer.run()


def test_power_ema_config_is_validated():
    from helpers_common import tiny_config

    from dew.config import ConfigError
    from dew.training.trainer import resolve_config

    with pytest.raises(
        ConfigError, match=r"config\.ema\.power_std_rels=\(0\.05, 0\.5\) is invalid: expected distinct"
    ):
        resolve_config(tiny_config(**{"ema.power_std_rels": (0.05, 0.5)}))
    with pytest.raises(ValueError, match="snapshot_every must be an int >= 1"):
        PowerEMA((0.05,), 0)


def test_slots_snapshots_and_phema_checkpoint(tmp_path, capsys):
    trainer, state = _trained(tmp_path)
    run = trainer.workdir
    assert state.power_ema is not None and len(state.power_ema) == 2
    store = PowerEMASnapshots(os.path.join(run, "power_ema"), read_only=True)
    assert store.steps() == [2, 4, 6]
    snapshots = store.snapshots()
    store.close()
    assert [(s.t, s.std_rel) for s in snapshots] == [(t, s) for t in (2, 4, 6) for s in (0.05, 0.1)]
    # the last snapshot of each profile is the state's slot
    for slot, snap in zip(state.power_ema, snapshots[-2:], strict=True):
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(slot), snap.params)
    # A tracked profile lies in the span of the snapshots: its reconstruction picks exactly that
    # snapshot (weights one-hot up to the solve's round-off; parameters are O(1), float32).
    again = posthoc_ema.reconstruct(snapshots, 0.1)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), again, snapshots[-1].params)

    from dew.phema import main

    assert main([f"--workdir={run}", "--sigma_rel=0.07"]) == 0
    out = os.path.join(run, "phema", "sigma_rel_0.070")
    assert "sigma_rel=0.070" in capsys.readouterr().out
    with open(os.path.join(out, "run.json")) as f:
        record = json.load(f)["phema"]
    assert record["step"] == 6 and record["updates"] == 6 and len(record["snapshots"]) == 6
    expected = posthoc_ema.reconstruct(snapshots, 0.07)

    from dew.checkpointing import Checkpoints

    restored = Checkpoints(os.path.join(out, "checkpoints"), read_only=True).restore_ema(None)
    jax.tree.map(np.testing.assert_array_equal, restored, expected)  # stored as is, no debiasing
    # and it differs from both tracked profiles (the reconstruction did something)
    assert not np.allclose(jax.tree.leaves(expected)[0], jax.tree.leaves(snapshots[-1].params)[0])

    # bad input: exit 2, one line, nothing written
    assert main([f"--workdir={run}", "--sigma_rel=0.07"]) == 2  # output exists already
    assert main([f"--workdir={run}", "--sigma_rel=0.4", f"--out={tmp_path / 'x'}"]) == 2
    assert main([f"--workdir={run}", "--sigma_rel=0.07", "--step=3", f"--out={tmp_path / 'y'}"]) == 2
    assert main([f"--workdir={tmp_path}", "--sigma_rel=0.07", f"--out={tmp_path / 'z'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("error: ") for line in err), err
    assert "already holds checkpoints" in err[0] and "sigma_rel=[0.4]" in err[1]
    assert "snapshot steps are [2, 4, 6]" in err[2] and "not a dew run" in err[3]
    assert not any(os.path.exists(tmp_path / d) for d in "xyz")

    # Resume: the checkpoint holds the slots (their own item), so a longer run continues them
    # and snapshots newer than the restored step are redone.
    from helpers_common import tiny_config

    from dew.training.trainer import Trainer

    config = tiny_config(
        **{
            "ema.power_std_rels": (0.05, 0.1),
            "ema.snapshot_every": 2,
            "eval.every": 0,
            "preview.every": 0,
            "train.num_steps": 8,
        }
    )
    resumed = Trainer(config, run)
    start = resumed.initial_state()
    assert int(start.step) == 6 and start.power_ema is not None
    for slot, snap in zip(start.power_ema, snapshots[-2:], strict=True):
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(slot), snap.params)
    resumed.run()
    store = PowerEMASnapshots(os.path.join(run, "power_ema"), read_only=True)
    assert store.steps() == [2, 4, 6, 8]
    store.close()


def test_power_slots_update_only_at_accumulation_boundaries():
    """With k micro-batches per update the slots move once per k steps, with β at update n."""
    import optax

    from dew.inputs import Field, InputSpec
    from dew.objectives.base import Aux, EMASpec, Objective
    from dew.training.steps import make_init, make_step

    class Quadratic(Objective):
        input_spec = InputSpec(Field("x", (3,)))

        def init(self, rng, batch):
            return {"w": jax.numpy.ones(3)}

        def loss(self, params, rng, batch, step):
            return jax.numpy.sum((params["w"] - batch["x"].mean(0)) ** 2), ({}, Aux())

    power = PowerEMA((0.05, 0.1), 1)
    objective, opt = Quadratic(), optax.sgd(0.1)
    batch = {"x": jax.numpy.asarray(np.arange(6.0).reshape(2, 3))}
    init = make_init(objective, opt, EMASpec(0.9), accumulation=2, power_ema=power)
    step = jax.jit(make_step(objective, opt, EMASpec(0.9), accumulation=2, power_ema=power))
    state = init(jax.random.PRNGKey(0), batch)
    expected = [np.zeros(3), np.zeros(3)]
    for i in range(6):
        state, _ = step(state, batch)
        if (i + 1) % 2 == 0:
            n = (i + 1) // 2
            p = np.asarray(state.params["w"])
            for j, g in enumerate(power.gammas):
                beta = (1 - 1 / n) ** (g + 1)
                expected[j] = beta * expected[j] + (1 - beta) * p
        for slot, e in zip(state.power_ema, expected, strict=True):
            np.testing.assert_allclose(np.asarray(slot["w"]), e, rtol=1e-5)
