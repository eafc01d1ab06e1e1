"""``dew.converted_run.command``: the steps ``python -m dew.convert_edm`` and ``python -m
dew.convert_dit`` share around their conversion: leftover arguments must be ``--config.*``
overrides, a workdir holding checkpoints is refused, bad input is one ``error:`` line with exit
status 2 and the workdir the conversion made removed (one it found is kept). The conversions
themselves, through a real Trainer, are tests/system/test_convert_edm.py and test_convert_dit.py."""

from __future__ import annotations

import pytest

from dew import convert_dit, convert_edm, converted_run
from dew.config import ConfigError
from dew.registry import UnknownNameError


def test_the_converters_share_one_conversion_error():
    assert convert_edm.ConversionError is converted_run.ConversionError
    assert convert_dit.ConversionError is converted_run.ConversionError


def test_success_prints_the_line_and_hands_over_the_overrides(tmp_path, capsys):
    calls = []

    def write(workdir, overrides):
        calls.append((workdir, overrides))
        return "converted it"

    rest = ["--config.model.depth=3", "--config.dataset.name=digits"]
    assert converted_run.command(str(tmp_path / "run"), rest, write) == 0
    assert calls == [(str(tmp_path / "run"), ["config.model.depth=3", "config.dataset.name=digits"])]
    assert capsys.readouterr().out == "converted it\n"


def test_an_argument_that_is_no_override_is_refused_before_anything(tmp_path, capsys):
    def write(workdir, overrides):
        raise AssertionError("not reached")

    assert converted_run.command(str(tmp_path / "run"), ["--config.a=1", "--stpe=3"], write) == 2
    assert capsys.readouterr().err == (
        "error: unrecognised argument '--stpe=3' (config keys are set with --config.<key>=<value>)\n"
    )


def test_a_workdir_holding_checkpoints_is_refused(tmp_path, capsys):
    (tmp_path / "checkpoints" / "1").mkdir(parents=True)
    assert converted_run.command(str(tmp_path), [], lambda w, o: "never") == 2
    err = capsys.readouterr().err
    assert err == f"error: --workdir {tmp_path} already holds checkpoints; choose an empty directory\n"
    assert (tmp_path / "checkpoints" / "1").is_dir()
    (tmp_path / "checkpoints" / "1").rmdir()  # an empty checkpoints folder is no objection
    assert converted_run.command(str(tmp_path), [], lambda w, o: "done") == 0


@pytest.mark.parametrize(
    "error",
    [
        converted_run.ConversionError("blocks.2.attn: no such key\nsecond line"),
        ConfigError("config.model.depth=0 is invalid"),
        UnknownNameError("unknown model 'ditt'; closest: 'dit'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_a_made_workdir_is_removed(tmp_path, capsys, error):
    workdir = tmp_path / "run"

    def write(directory, overrides):
        (workdir / "checkpoints").mkdir(parents=True)  # half written when the error comes
        raise error

    assert converted_run.command(str(workdir), [], write) == 2
    assert capsys.readouterr().err == f"error: {str(error).splitlines()[0]}\n"
    assert not workdir.exists()


def test_a_workdir_that_existed_is_kept_and_other_failures_propagate(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")

    def refused(directory, overrides):
        raise converted_run.ConversionError("does not fit")

    assert converted_run.command(str(tmp_path), [], refused) == 2
    assert (tmp_path / "notes.txt").read_text() == "mine"

    def crashes(directory, overrides):
        raise RuntimeError("a bug, not bad input")

    with pytest.raises(RuntimeError, match="a bug"):
        converted_run.command(str(tmp_path / "new"), [], crashes)
