"""``python -m dew.convert_edm``: a reference network's weights become a dew checkpoint whose
debiased EMA reproduces the reference's denoiser (no PyTorch needed)."""

from __future__ import annotations

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew
from dew import convert_edm
from dew.checkpointing import Checkpoints
from dew.config import load_config
from dew.objectives.diffusion import Diffusion
from dew.training.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "third_party" / "edm" / "songunet_skip.npz"  # 8x8x1, unconditional: digits' shape


def reference_config():
    """experiments/edm.py with the stored network's arguments, unconditional (as it was made)."""
    with np.load(REFERENCE, allow_pickle=False) as data:
        kwargs = json.loads(str(data["config_json"]))
    config = load_config(str(ROOT / "experiments" / "edm.py"))
    with config.unlocked():
        config.objective.condition = "none"
        config.dataset.batch_size = 4
        config.mesh.devices = 1  # one device (conftest makes eight)
        for key, value in kwargs.items():
            if key not in ("img_resolution", "img_channels", "model_type", "label_dim"):
                config.model[key] = tuple(value) if isinstance(value, list) else value
    return config


@pytest.mark.default_compiler  # compares with the reference's recorded samples
def test_converted_checkpoint_samples_like_the_reference(tmp_path):
    workdir = tmp_path / "converted"
    config = reference_config()
    state_dict = convert_edm.read_state_dict(str(REFERENCE))
    directory = convert_edm.convert(state_dict, config, str(workdir), source=str(REFERENCE))
    assert directory == str(workdir / "checkpoints")

    trainer = Trainer(config, str(tmp_path / "reader"))
    template = jax.eval_shape(trainer.programs.init, jax.random.PRNGKey(0), trainer.example_batch()).params
    checkpoints = Checkpoints(directory, read_only=True)
    assert checkpoints.latest == 1
    params = checkpoints.restore_ema(template, 1)  # debiased with the EMA the checkpoint records
    with np.load(REFERENCE, allow_pickle=False) as data:
        x = jnp.asarray(data["x"].transpose(0, 2, 3, 1))
        sigma, expected = jnp.asarray(data["sigma"]), data["denoised"].transpose(0, 2, 3, 1)
    objective = trainer.objective
    assert isinstance(objective, Diffusion)
    denoised = jax.jit(lambda p: objective.denoiser(p, {})(x, sigma))(params)
    # Same bound as tests/test_edm_networks.py (float32 summation order), plus the EMA's
    # multiply-then-divide by 1 − β (two roundings, ~1e-7 relative).
    np.testing.assert_allclose(np.asarray(denoised), expected, atol=1e-5, rtol=0)

    # The converted workdir is a run as dew's readers expect one (run.json beside checkpoints/):
    # dew.pipeline, python -m dew.sample and the scoring scripts load it as they load a trained run.
    metadata = json.loads((workdir / "run.json").read_text())
    assert metadata["converted"] == {"state_dict": str(REFERENCE), "architecture": "songunet", "step": 1}
    task = dew.pipeline(str(workdir))
    assert task.step == 1 and not task.raw
    through_pipeline = jax.jit(lambda p: task.objective.denoiser(p, {})(x, sigma))(task.params)
    np.testing.assert_array_equal(np.asarray(through_pipeline), np.asarray(denoised))

    # A run started in the converted workdir resumes its checkpoint: the converted weights, and
    # the data stream from its first batch (the position saved is a fresh stream's).
    resumed = Trainer(config, str(workdir))
    state = resumed.initial_state()
    assert int(state.step) == 1 and resumed.restored_step == 1
    stored, _ = checkpoints.restore(None, 1)  # the live parameters: the converted weights
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), jax.device_get(stored.params))
    first = next(iter(resumed.train_data))
    fresh_first = next(iter(Trainer(config, str(tmp_path / "fresh")).train_data))
    jax.tree.map(np.testing.assert_array_equal, first, fresh_first)


def test_weights_that_do_not_fit_exit_2_and_write_nothing(tmp_path, capsys):
    workdir = tmp_path / "converted"
    argv = [
        f"--state_dict={REFERENCE}",
        f"--config={ROOT / 'experiments' / 'edm.py'}",
        f"--workdir={workdir}",
    ]
    # The default digits network (ch 32, 2 levels, 10 classes) is not the stored one (ch 8, 3 levels).
    assert (
        convert_edm.main([*argv, "--config.mesh.devices=1", "--config.model.resample_filter=(1, 3, 3, 1)"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "songunet/" in err  # names the first parameter that does not fit
    assert not os.path.exists(workdir)


def test_a_missing_or_foreign_file_exits_2(tmp_path, capsys):
    config = f"--config={ROOT / 'experiments' / 'edm.py'}"
    assert (
        convert_edm.main([f"--state_dict={tmp_path / 'nope.npz'}", config, f"--workdir={tmp_path / 'w'}"])
        == 2
    )
    assert "no file at" in capsys.readouterr().err
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0")
    assert convert_edm.main([f"--state_dict={other}", config, f"--workdir={tmp_path / 'w'}"]) == 2
    assert "must end in .npz, .pt or .pth" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
