"""Configs: overrides are type-checked against the file's values, and bad input stops the run
before anything is written."""

from __future__ import annotations

import os

import pytest
from conftest import ROOT

from dew.config import ConfigError, apply_overrides, load_config
from dew.main import main

EDM = str(ROOT / "experiments" / "edm.py")


def test_overrides_take_the_type_of_the_config_value():
    config = apply_overrides(
        load_config(EDM),
        [
            "config.train.num_steps=12",
            "config.optimizer.learning_rate=1e-4",
            "config.model.channel_mult=(1,2,2)",
            "config.dataset.name=digits",
            "config.tracking.backends=('local',)",
        ],
    )
    assert config.train.num_steps == 12
    assert config.optimizer.learning_rate == 1e-4
    assert config.model.channel_mult == (1, 2, 2)
    assert config.tracking.backends == ("local",)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("config.train.num_stpes=5", "unknown config key 'config.train.num_stpes'.*did you mean 'num_steps'"),
        ("config.nothing.here=1", "unknown config key 'config.nothing'"),
        ("config.train.num_steps=ten", "config.train.num_steps='ten': expected an int"),
        ("config.optimizer.learning_rate=fast", "config.optimizer.learning_rate='fast': expected a float"),
        ("config.model.channel_mult=('a',)", "expected a sequence of int"),
        ("config.train=3", "expected a sub-key"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(load_config(EDM), [override])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config.train.num_stpes=5"], "unknown config key 'config.train.num_stpes'"),
        (["--config.dataset.name=mnist"], "config.dataset.name: unknown datasets 'mnist'"),
        (["--config.model.name=unte"], "did you mean 'unet'"),
        (["--config.sampling.solver=rk4"], "config.sampling.solver: unknown samplers 'rk4'"),
        (["--config.ema.decay=1.5"], r"config.ema.decay=1.5 is invalid: expected a float in \[0, 1\)"),
        (["--config.tracking.backends=('local','tensorbored')"], "config.tracking.backends"),
        (
            ["--config.sampling.guidance_interval=(3.0,1.0)"],
            r"config.sampling.guidance_interval=\(3.0, 1.0\)",
        ),
        (["--config.tracking.wandb_mode=loud"], "config.tracking.wandb_mode='loud' is invalid"),
    ],
)
def test_bad_input_stops_before_writing_anything(tmp_path, capsys, args, message):
    workdir = tmp_path / "run"
    assert main(["--config", EDM, "--workdir", str(workdir), *args]) == 2
    assert pytest.importorskip("re").search(message, capsys.readouterr().err)
    assert not workdir.exists()


def test_a_workdir_that_is_a_file_is_refused_and_left_alone(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    assert main(["--config", EDM, "--workdir", str(path)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert path.read_text() == "keep me"
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_missing_config_file_is_named(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "nope.py"), "--workdir", str(tmp_path / "w")]) == 2
    assert "no config file at" in capsys.readouterr().err
