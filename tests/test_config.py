"""Configs: overrides are type-checked against the file's values, and bad input stops the run
before anything is written."""

from __future__ import annotations

import os

import pytest
from helpers_common import ROOT

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
        (
            ["--config.objective.sampling.solver=rk4"],
            "config.objective.sampling.solver: unknown samplers 'rk4'",
        ),
        (  # a registered sampler of another objective (SiT's) is not a σ solver
            ["--config.objective.sampling.solver=transport_ode"],
            r"config.objective.sampling.solver='transport_ode' is invalid: expected a σ solver",
        ),
        (["--config.ema.decay=1.5"], r"config.ema.decay=1.5 is invalid: expected a float in \[0, 1\)"),
        (["--config.tracking.backends=('local','tensorbored')"], "config.tracking.backends"),
        (
            ["--config.objective.sampling.guidance_interval=(3.0,1.0)"],
            r"config.objective.sampling.guidance_interval=\(3.0, 1.0\)",
        ),
        (["--config.tracking.wandb_mode=loud"], "config.tracking.wandb_mode='loud' is invalid"),
        (
            ["--config.train.steps_per_call=0"],
            r"config.train.steps_per_call=0 is invalid: expected an int >= 1",
        ),
        (
            ["--config.optimiser.learning_rate=1.0"],
            "unknown config key 'config.optimiser'; did you mean 'optimizer'",
        ),
        (["--config.dataset.batch_size=4096"], r"batch_size=4096 is invalid: .*must be in \[1, 1617\]"),
        (["--config.eval.num_batches=50"], "config.eval.num_batches=50 is invalid: .*only 2 fit"),
        (  # 180 validation digits: a training batch of 256 needs its own evaluation batch size
            ["--config.dataset.batch_size=256"],
            r"config.dataset.batch_size=256 is invalid: .*'digits/validation'.*set config.eval.batch_size",
        ),
        (
            ["--config.dataset.batch_size=256", "--config.eval.batch_size=200"],
            r"config.eval.batch_size=200 is invalid: .*must be in \[1, 180\]",
        ),
        (  # one batch of 100 fits the 180 validation digits: only the mesh's check fails
            ["--config.eval.batch_size=100", "--config.eval.num_batches=1"],
            "config.eval.batch_size.* not divisible by the data-parallel",
        ),
        (["--config.eval.batch_size=0"], r"config.eval.batch_size=0 is invalid: expected an int >= 1"),
        (["--config.dataset.name=oxford_flowers102"], "tfds data set 'oxford_flowers102' is not prepared"),
        (["--config.dataset.name=gaussian_mixture"], "cannot build parameters for 'gaussian_mixture/train'"),
        (["--config.preview.metrics=('fud',)"], "config.preview.metrics: unknown metrics 'fud'"),
        (
            ["--config.preview.metrics=('fid',)"],
            "config.preview.metrics: 'fid' cannot be scored: .*DEW_FID_REFERENCE",
        ),
    ],
)
def test_bad_input_stops_before_writing_anything(tmp_path, capsys, args, message):
    workdir = tmp_path / "run"
    assert main(["--config", EDM, "--workdir", str(workdir), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")  # one line
    assert pytest.importorskip("re").search(message, err)
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


def write_experiment(tmp_path, body: str):
    path = tmp_path / "experiment.py"
    path.write_text(
        "from ml_collections import ConfigDict\n\n\ndef get_config():\n"
        "    config = ConfigDict()\n"
        + "".join(f"    {line}\n" for line in body.splitlines())
        + "    return config\n"
    )
    return path


def test_a_typo_in_the_experiment_file_is_one_line_naming_the_closest_key(tmp_path, capsys):
    path = write_experiment(tmp_path, 'config.optimiser = ConfigDict({"learning_rate": 1e-3})')
    workdir = tmp_path / "run"
    assert main([f"--config={path}", f"--workdir={workdir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown config key 'config.optimiser'; did you mean 'optimizer'" in err
    assert not workdir.exists()


def test_a_wrong_kind_in_the_experiment_file_is_named(tmp_path, capsys):
    path = write_experiment(tmp_path, 'config.train = ConfigDict({"num_steps": "ten"})')
    assert main([f"--config={path}", f"--workdir={tmp_path / 'run'}"]) == 2
    assert "config.train.num_steps='ten': expected an int, got str" in capsys.readouterr().err


def test_a_syntax_error_in_the_experiment_file_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text("from ml_collections import ConfigDict\n\ndef get_config(:\n    return ConfigDict()\n")
    assert main([f"--config={path}", f"--workdir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}, line 3" in err
    assert not (tmp_path / "run").exists()


def test_omitted_keys_take_defaults_and_stay_overridable(tmp_path):
    path = write_experiment(tmp_path, 'config.train = ConfigDict({"num_steps": 5})')
    config = apply_overrides(
        load_config(str(path)), ["config.train.accumulation=2", "config.profile.warmup=3"]
    )
    assert config.train.num_steps == 5 and config.train.accumulation == 2
    assert config.train.log_every == 50 and config.profile.warmup == 3
    assert config.objective.sampling.solver == "heun"  # the diffusion objective's own default
    assert config.checkpoint.keep_best is True


def test_help_config_prints_the_resolved_schema_and_writes_nothing(tmp_path, capsys):
    assert main([f"--config={EDM}", "--help-config", "--config.train.num_steps=7"]) == 0
    out = capsys.readouterr().out
    assert "train.num_steps = 7 (default 1000)  [int] micro-batches to train for" in out
    assert "objective.sampling.solver = 'heun'  [str] registered solver (dew.samplers)" in out
    assert "model.model_channels = 32 (default 128)  [int]" in out
    assert os.listdir(tmp_path) == []


def test_the_docs_help_config_excerpt_is_what_help_config_prints(capsys):
    """docs/configs.md's ``--help-config`` excerpt: each line is a line the command prints."""
    text = (ROOT / "docs" / "configs.md").read_text()
    command = "$ python -m dew.main --config=experiments/edm.py --help-config\n"
    assert command in text
    excerpt = [line for line in text.split(command, 1)[1].split("```", 1)[0].splitlines() if line != "..."]
    assert main([f"--config={EDM}", "--help-config"]) == 0
    printed = set(capsys.readouterr().out.splitlines())
    assert len(excerpt) > 10 and [line for line in excerpt if line not in printed] == []


def test_a_none_default_takes_the_kind_its_annotation_names():
    # songunet's label_dim: int | None = None: an int is accepted (it was refused as "a str").
    config = apply_overrides(load_config(EDM), ["config.model.label_dim=10"])
    assert config.model.label_dim == 10
    with pytest.raises(ConfigError, match=r"config\.model\.label_dim"):
        apply_overrides(load_config(EDM), ["config.model.label_dim=ten"])
