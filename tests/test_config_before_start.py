"""Config values whose checks need no measurement stop before it and before anything is written:
at resolution (``apply_overrides``: ranges, shapes, a ``restore_dir`` that is not there), or
against the workdir and the data before the platform starts (``check_before_start``: the step
to restore, the validation batches). Each is one line naming the key, the value and what is
accepted."""

from __future__ import annotations

import os
import re

import pytest
from helpers_common import ROOT, tiny_config

from dew.config import apply_overrides, load_config
from dew.launch import Run
from dew.main import main
from dew.schema import ConfigError
from dew.training.trainer import Trainer
from dew.training.trainer_config import check_before_start, check_workdir

EDM = str(ROOT / "experiments" / "edm.py")


@pytest.mark.parametrize(
    ("experiment", "override", "message"),
    [
        (  # the adaptive weight 1 / (‖Δ‖² + ε)^p with p < 0 weighs the worst errors up
            "meanflow.py",
            "config.objective.norm_p=-1",
            "config.objective.norm_p=-1.0 is invalid: expected a finite float >= 0",
        ),
        ("meanflow.py", "config.objective.norm_p=nan", "config.objective.norm_p=nan is invalid"),
        (
            "sit.py",
            "config.objective.sampling.guidance_interval=(0.1, 0.2, 0.3)",
            "config.objective.sampling.guidance_interval=(0.1, 0.2, 0.3) is invalid: "
            "expected (t_lo, t_hi) with 0 <= t_lo <= t_hi <= 1",
        ),
        (
            "sit.py",
            "config.objective.sampling.guidance_interval=()",
            "config.objective.sampling.guidance_interval=() is invalid: expected (t_lo, t_hi)",
        ),
    ],
)
def test_a_value_out_of_its_range_is_named_at_resolution(experiment, override, message):
    with pytest.raises(ConfigError) as caught:
        apply_overrides(load_config(str(ROOT / "experiments" / experiment)), [override])
    assert str(caught.value).startswith(message), str(caught.value)


def test_the_papers_adaptive_weights_and_intervals_still_resolve():
    meanflow = load_config(str(ROOT / "experiments" / "meanflow.py"))
    for p in ("0", "0.5", "1.0", "2.0"):
        assert apply_overrides(meanflow, [f"config.objective.norm_p={p}"]).objective.norm_p == float(p)
    sit = apply_overrides(
        load_config(str(ROOT / "experiments" / "sit.py")),
        ["config.objective.sampling.guidance_interval=(0.0, 0.7)"],
    )
    assert sit.objective.sampling.guidance_interval == (0.0, 0.7)


def started(*args, **kwargs):
    raise AssertionError("the run started")


@pytest.mark.parametrize("kind", ["missing", "a file", "empty"])
def test_a_restore_dir_that_holds_no_checkpoint_stops_the_cli_before_anything_is_written(
    tmp_path, capsys, monkeypatch, kind
):
    """Once ignored: the run trained from its random initialisation and said nothing."""
    monkeypatch.setattr(Run, "start", started)
    restore = tmp_path / "elsewhere" / "checkpoints"
    if kind == "a file":
        restore.parent.mkdir()
        restore.write_text("not a directory")
    elif kind == "empty":
        restore.mkdir(parents=True)
    found = {"missing": "does not exist", "a file": "is not a directory", "empty": "holds no checkpoint step"}
    workdir = tmp_path / "run"
    args = ["--config", EDM, "--workdir", str(workdir), f"--config.checkpoint.restore_dir={restore}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: config.checkpoint.restore_dir='{restore}' is invalid: expected a directory holding "
        f"checkpoints (e.g. a previous run's <workdir>/checkpoints); {restore} {found[kind]}\n"
    )
    assert not workdir.exists()


def fake_steps(directory, *steps):
    for step in steps:
        os.makedirs(os.path.join(directory, str(step)))
    os.makedirs(os.path.join(directory, "12.orbax-checkpoint-tmp-3"))  # a save in flight: no step


def test_a_step_to_restore_on_a_new_workdir_is_refused_and_nothing_is_created(tmp_path):
    workdir = str(tmp_path / "run")
    config = tiny_config(**{"checkpoint.step_to_restore": 7})
    with pytest.raises(ConfigError) as caught:
        check_workdir(workdir, config)
    assert str(caught.value) == (
        f"config.checkpoint.step_to_restore=7 is invalid: {workdir}/checkpoints holds no checkpoint "
        "for step 7 (it holds none); expected a stored step, or None for the latest"
    )
    assert os.listdir(tmp_path) == []


def test_a_step_to_restore_is_looked_for_where_the_restore_reads_it(tmp_path):
    workdir = str(tmp_path / "run")
    fake_steps(f"{workdir}/checkpoints", 4, 8)
    with pytest.raises(ConfigError, match=r"holds no checkpoint for step 7 \(its steps are \[4, 8\]\)"):
        check_before_start(tiny_config(**{"checkpoint.step_to_restore": 7}), workdir)
    check_before_start(tiny_config(**{"checkpoint.step_to_restore": 4}), workdir)
    # A local tier's step counts (it may be the latest).
    fake_steps(f"{tmp_path}/local/process_0", 9)
    local = {"checkpoint.local_directory": f"{tmp_path}/local", "checkpoint.local_every": 1}
    check_before_start(tiny_config(**{"checkpoint.step_to_restore": 9, **local}), workdir)
    # restore_dir is the source while the run's own directory holds nothing.
    other = str(tmp_path / "other")
    fake_steps(f"{tmp_path}/source", 3)
    restore = {"checkpoint.restore_dir": f"{tmp_path}/source"}
    check_before_start(tiny_config(**{"checkpoint.step_to_restore": 3, **restore}), other)
    with pytest.raises(ConfigError, match=rf"{tmp_path}/source holds no checkpoint for step 4 \(its steps"):
        check_before_start(tiny_config(**{"checkpoint.step_to_restore": 4, **restore}), other)


def test_validation_batches_that_do_not_fit_are_refused_before_the_platform(tmp_path):
    # 180 validation digits hold 11 batches of 16.
    with pytest.raises(ConfigError) as caught:
        check_before_start(tiny_config(**{"eval.num_batches": 50}), str(tmp_path / "run"))
    assert str(caught.value) == (
        "config.eval.num_batches=50 is invalid: Dataset 'digits/validation': asked for 50 batches, "
        "only 11 fit"
    )
    check_before_start(tiny_config(**{"eval.num_batches": 50, "eval.every": 0}), str(tmp_path / "run"))
    check_before_start(tiny_config(**{"eval.num_batches": 11}), str(tmp_path / "run"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"eval.num_batches": 50}, "config.eval.num_batches=50 is invalid"),
        ({"checkpoint.step_to_restore": 7}, "config.checkpoint.step_to_restore=7 is invalid"),
    ],
)
def test_a_trainer_built_in_user_code_checks_them_before_it_starts_the_platform(
    tmp_path, monkeypatch, overrides, message
):
    """The platform's start presents the devices and opens the compilation cache: the checks come
    first, and nothing is written."""
    from dew.runtime import platform

    monkeypatch.setattr(platform, "start_for", started)
    with pytest.raises(ConfigError, match=re.escape(message)):
        Trainer(tiny_config(**overrides), str(tmp_path / "run"))
    assert os.listdir(tmp_path) == []


def test_the_cli_checks_them_before_it_starts_the_platform(tmp_path, monkeypatch, capsys):
    import dew.launch

    monkeypatch.setattr(dew.launch, "start_platform", started)
    workdir = tmp_path / "run"
    assert main(["--config", EDM, "--workdir", str(workdir), "--config.checkpoint.step_to_restore=7"]) == 2
    assert capsys.readouterr().err.startswith("error: config.checkpoint.step_to_restore=7 is invalid")
    assert not workdir.exists()


def test_a_step_to_restore_that_is_not_stored_is_one_line_from_the_cli(tmp_path, capsys):
    """Once: exit 1 with a traceback file, leaving ``logs/`` and ``run.lock`` behind. (Until
    ``dew.launch`` passes the config to ``check_workdir`` it is found after the platform starts,
    by the Trainer.)"""
    workdir = tmp_path / "run"
    assert main(["--config", EDM, "--workdir", str(workdir), "--config.checkpoint.step_to_restore=7"]) == 2
    assert capsys.readouterr().err == (
        f"error: config.checkpoint.step_to_restore=7 is invalid: {workdir}/checkpoints holds no checkpoint "
        "for step 7 (it holds none); expected a stored step, or None for the latest\n"
    )
    assert not (workdir / "logs").exists() and not (workdir / "run.lock").exists()


def test_the_validation_split_the_check_opens_is_the_one_the_trainer_reads(tmp_path, monkeypatch):
    """Opened once: an image folder decodes every image when it opens."""
    from dew.data import splits
    from dew.training import build

    opened = []
    real = splits._open
    monkeypatch.setattr(splits, "_open", lambda section, split: opened.append(split) or real(section, split))
    config = tiny_config()
    check_before_start(config, str(tmp_path / "run"))
    assert opened == ["validation"]
    kept = build.open_split(config.dataset, "validation")  # what the Trainer asks for next
    assert opened == ["validation"]
    assert build.open_split(config.dataset, "validation") is not kept and opened == ["validation"] * 2
    assert build.open_split(config.dataset, "train") is not None and opened[-1] == "train"
