"""Input a person can fix, given to the command-line tools: one line naming the flag or the path
and what would be accepted, exit status 2, nothing written. An empty ``--workdir=``, a damaged or
deleted ``run.json``, a workdir that cannot be written (``/proc``, a read-only file system, a full
disk at a restart), a file that is not an ``.npz``, a ``dew.sample`` option of the wrong kind.

The runs are the tiny 2D mixture's (``helpers_cli.TINY_MIXTURE``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from helpers_cli import cli as cli_on
from helpers_cli import command, dew_stderr, env, snapshot
from helpers_common import ROOT

import dew
from dew import convert_edm, fid
from dew.inference import PipelineError


def cli(workdir, **overrides) -> subprocess.CompletedProcess:
    """``helpers_cli.cli`` on the tiny 2-D mixture run, with dotted config ``overrides``."""
    return cli_on(workdir, experiment="mixture", **overrides)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One untouched 8-step run of the tiny mixture config (checkpoints at steps 4 and 8)."""
    workdir = tmp_path_factory.mktemp("straight") / "run"
    result = cli(workdir)
    assert result.returncode == 0, result.stderr
    return workdir


def copy_of(straight, target):
    shutil.copytree(straight, target, ignore=shutil.ignore_patterns("logs"))
    return target


def one_line_exit_2(result) -> str:
    """The bad-input contract: exit 2, one dew line on stderr, ``error: ...``, no traceback."""
    lines = dew_stderr(result)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


# --- 12: an empty --workdir= -----------------------------------------------------------------------
def test_an_empty_workdir_is_refused_and_nothing_is_written_in_the_current_directory(tmp_path):
    argv = [a if not a.startswith("--workdir=") else "--workdir=" for a in command("x", "mixture")]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env(), timeout=600)
    line = one_line_exit_2(result)
    assert "--workdir='' is empty" in line and "e.g. --workdir=" in line
    assert os.listdir(tmp_path) == []


# --- 14: run.json damaged or deleted ---------------------------------------------------------------
@pytest.mark.parametrize("damage", ["", '{"label": "run", "starts": [', "[1, 2]", b"\xff\xfe"])
def test_a_damaged_run_json_is_named_and_nothing_is_written(straight, tmp_path, damage):
    workdir = copy_of(straight, tmp_path / "run")
    path = workdir / "run.json"
    path.write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    before = snapshot(workdir)
    line = one_line_exit_2(cli(workdir, **{"train.num_steps": 12}))
    assert line.startswith(f"error: {path} is damaged (")
    assert "Restore it from a copy, or move it aside" in line
    assert snapshot(workdir) == before
    with pytest.raises(ValueError, match=f"{path} is damaged"):  # a reader names it too
        dew.pipeline(str(workdir))


def test_a_deleted_run_json_is_said_and_recorded_as_lost_history(straight, tmp_path):
    workdir = copy_of(straight, tmp_path / "run")
    (workdir / "run.json").unlink()
    result = cli(workdir, **{"train.num_steps": 12})
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if "was missing" in line]
    assert said == [
        f"dew: {workdir / 'run.json'} was missing while the run resumes from step 8: the starts before "
        "it are not recorded (noted under 'lost_history' in a new run.json); the data position carries "
        "over as if the batch size and process count were unchanged"
    ]
    metadata = json.loads((workdir / "run.json").read_text())
    assert [s["resumed_from"] for s in metadata["starts"]] == [8]
    (lost,) = metadata["lost_history"]
    assert lost["before_step"] == 8 and lost["reason"] == "run.json was missing" and lost["time"]
    # A later start keeps the record of what was lost.
    again = cli(workdir, **{"train.num_steps": 16})
    assert again.returncode == 0, again.stderr
    assert "was missing" not in again.stdout
    metadata = json.loads((workdir / "run.json").read_text())
    assert metadata["lost_history"] == [lost]
    assert [s["resumed_from"] for s in metadata["starts"]] == [8, 12]


# --- 15: workdirs that cannot be written -------------------------------------------------------------
def test_a_workdir_under_proc_is_one_line_naming_it(tmp_path):
    line = one_line_exit_2(cli("/proc/dew-test-run"))
    assert line.startswith("error: --workdir=/proc/dew-test-run cannot be created: /proc/dew-test-run: ")
    assert "choose a directory you can write to as --workdir" in line


@pytest.fixture
def mount(tmp_path):
    """``mount(name, *options)``: a tmpfs at ``tmp_path/name``; skips where none can be mounted."""
    mounted = []

    def make(name: str, *options: str):
        target = tmp_path / name
        target.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(target)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(target)
        return target

    yield make
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_a_workdir_on_a_read_only_file_system_is_one_line_naming_it(mount):
    disk = mount("ro", "ro", "size=1m")
    workdir = disk / "run"
    line = one_line_exit_2(cli(workdir))
    assert line == (
        f"error: --workdir={workdir} cannot be created: {workdir}: Read-only file system; it is on a "
        "read-only file system: choose a writable --workdir"
    )


def test_a_restart_on_a_full_disk_is_one_line_naming_the_lock_file(straight, mount):
    disk = mount("full", "size=64m")
    workdir = copy_of(straight, disk / "run")
    filler = disk / "filler"
    try:  # every free block taken
        with open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError as e:
        assert e.errno == 28, e  # ENOSPC
    before = snapshot(workdir)
    line = one_line_exit_2(cli(workdir, **{"train.num_steps": 12}))
    assert line == (
        f"error: --workdir={workdir} cannot be used: {workdir / 'run.lock'}: No space left on device; "
        "free space on that file system, or choose a --workdir on another one"
    )
    assert snapshot(workdir) == before


# --- 16: a file that is not an .npz ------------------------------------------------------------------
def _not_npz(kind: str, path) -> None:
    if kind == "text":
        path.write_text("these are not weights\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "npy":
        with open(path, "wb") as f:
            np.save(f, np.zeros(3))
    else:  # a zip cut short, as an interrupted download leaves it
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("param/w.npy", b"\0" * 4096)
        path.write_bytes(path.read_bytes()[:100])


KINDS = ["text", "empty", "npy", "truncated zip"]
REASONS = {
    "text": "it is neither a zip archive nor a .npy array",
    "empty": "it is empty",
    "npy": "holds a single .npy array",
    "truncated zip": "BadZipFile",
}


@pytest.mark.parametrize("kind", KINDS)
def test_convert_edm_names_a_state_dict_that_is_not_an_npz(tmp_path, capsys, kind):
    bad = tmp_path / "x.npz"
    _not_npz(kind, bad)
    argv = [
        f"--state_dict={bad}",
        f"--config={ROOT / 'experiments' / 'edm.py'}",
        f"--workdir={tmp_path / 'w'}",
    ]
    assert convert_edm.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(f"error: --state_dict: {bad} ")
    assert "an .npz archive (a zip of .npy arrays, as numpy.savez writes)" in err and REASONS[kind] in err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("mode", ["score", "ref"])
@pytest.mark.parametrize("kind", KINDS)
def test_fid_names_weights_that_are_not_an_npz(tmp_path, capsys, kind, mode):
    """Both of ``dew.fid``'s FID Inception readers refuse the same file with the same line."""
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for i in range(2):
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(images / f"{i}.png")
    bad = tmp_path / "x.npz"
    _not_npz(kind, bad)
    out = tmp_path / "stats.npz"
    flags = (
        [f"--images={images}", f"--save_stats={out}"]
        if mode == "score"
        else ["ref", f"--data={images}", f"--dest={out}"]
    )
    assert fid.main([*flags, f"--weights={bad}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(f"error: --weights: FID Inception weights: {bad} ") and REASONS[kind] in err
    assert err.endswith("convert them with python -m dew.scoring.convert_inception")
    assert not out.exists()


# --- 17: a dew.sample option of the wrong kind ----------------------------------------------------
def test_a_sample_option_of_the_wrong_kind_names_the_flag_and_the_accepted_form(straight, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "dew.sample", f"--workdir={straight}", f"--out={out}", "--seed=abc"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(),
        timeout=600,
    )
    line = one_line_exit_2(result)
    assert line == "error: dew.sample: --seed=abc is invalid: expected an int, e.g. --seed=0"
    assert not out.exists()
    task = dew.pipeline(str(straight))
    for options, message in (
        ({"seed": "abc"}, "option seed='abc' is invalid: expected an int (the default is seed=0)"),
        ({"seed": 1.5}, "option seed=1.5 is invalid: expected an int"),
        ({"steps": True}, "option steps=True is invalid: expected an int"),
        ({"solver": 2}, "option solver=2 is invalid: expected a string"),
    ):
        with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace(")", r"\)")):
            task(**options)
    assert len(task(seed=3, guidance=1).images) > 0  # an int is a number where a float is the default
