"""``python -m dew.fid --preset=...`` on a real (tiny) run: bad input is one line, exit 2, nothing
written; and (slow) the whole command with the Inception network, interrupted and rerun."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
from test_fid_protocol import mlp_config

from dew.scoring import convert_inception
from dew.scoring import fid_protocol as fp
from dew.scoring.fid_reference import load_reference, save_reference
from dew.training.trainer import Trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    """A tiny class-conditional MLP diffusion run on the 8x8 digits, one checkpoint at step 2."""
    workdir = str(tmp_path_factory.mktemp("fidrun") / "run")
    Trainer(mlp_config(), workdir, []).run()
    return workdir


def _tree(folder) -> dict[str, tuple[int, int]]:
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            info = os.stat(os.path.join(root, name))
            found[os.path.relpath(os.path.join(root, name), folder)] = (info.st_size, info.st_mtime_ns)
    return found


def test_protocol_bad_input_is_one_line_exit_2_writing_nothing(run, tmp_path, capsys):
    from dew.fid import main

    ref_8 = tmp_path / "ref8.npz"
    save_reference(str(ref_8), np.zeros(4), np.eye(4), resolution=(8, 8), num_images=4, detector="d")
    ref_32 = tmp_path / "ref32.npz"
    save_reference(str(ref_32), np.zeros(4), np.eye(4), resolution=(32, 32), num_images=4, detector="d")
    ref_pf = tmp_path / "ref_pytorch_fid.npz"
    pytorch_fid = "dew inception_fid 2015-12-05, image handling pytorch_fid, weights sha256 " + "0" * 64
    save_reference(str(ref_pf), np.zeros(4), np.eye(4), resolution=(8, 8), num_images=4, detector=pytorch_fid)
    adm_8 = tmp_path / "adm8.npz"  # an ADM reference batch of 8x8 images (arr_0 only)
    np.savez(adm_8, arr_0=np.zeros((5, 8, 8, 3), np.uint8))
    (tmp_path / "empty").mkdir()
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "out"
    ok = [f"--workdir={run}", "--preset=cifar10", f"--ref={ref_8}", f"--outdir={out}"]
    cases = [
        (["--preset=cifar100"], "--preset='cifar100' is not a sampler preset; expected one of ['afhqv2', "),
        (
            ["--preset=dit"],
            "--preset='dit' draws 'iddpm' runs, but --workdir is a 'diffusion' run; expected one of its "
            "presets ['afhqv2', 'cifar10', 'ffhq', 'imagenet64']",
        ),
        (
            ["--preset=sit", "--metrics=fid,sfid", f"--ref={adm_8}"],
            "--preset='sit' draws 'interpolant' runs, but --workdir is a ",
        ),
        # FID's statistics are no ADM reference batch, refused before the run is loaded
        (["--metrics=fid,sfid"], "ref8.npz: member 'mu' has shape (4,); expected float [2048]"),
        (["--num=0"], "--num=0 is invalid: expected an int >= 2"),
        (["--num=-5"], "--num=-5 is invalid: expected an int >= 2"),
        (["--num=many"], "argument --num: invalid int value: 'many'"),
        (["--batch=0"], "--batch=0 is invalid: expected an int >= 1"),
        ([f"--ref={tmp_path / 'none.npz'}"], "none.npz' does not exist; expected an .npz with mu"),
        ([f"--ref={tmp_path / 'a_file'}"], "is not an .npz archive"),
        ([f"--ref={ref_32}"], "was computed at resolution 32x32, the samples are 8x8; compute the reference"),
        ([f"--workdir={tmp_path / 'empty'}"], "is not a dew run: no run.json"),
        ([f"--outdir={tmp_path / 'a_file'}"], "is a file; expected a directory"),
        ([f"--weights={tmp_path / 'none.npz'}"], "FID Inception weights not found"),
        (["--image_handling=tf2"], "argument --image_handling: invalid choice: 'tf2'"),
        (
            [f"--ref={ref_pf}"],
            "computed with image handling 'pytorch_fid', the samples are embedded with 'tf1'",
        ),
    ]
    before = _tree(run), _tree(tmp_path)
    for change, message in cases:
        flags = {a.split("=")[0]: a for a in ok}
        flags.update({a.split("=")[0]: a for a in change})
        assert main(list(flags.values())) == 2, change
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (change, lines)
        assert captured.out == "" and not out.exists(), change
    assert main(["--preset=cifar10", f"--ref={ref_8}", f"--outdir={out}"]) == 2  # no --workdir
    assert "the following arguments are required: --workdir" in capsys.readouterr().err
    assert (_tree(run), _tree(tmp_path)) == before


@pytest.mark.slow  # the Inception network at 299x299 on CPU: ~40 images through it
def test_the_protocol_command_interrupted_and_rerun_reports_the_uninterrupted_fid(run, tmp_path, capsys):
    from helpers_fid import random_state_dict

    from dew.fid import main

    weights = tmp_path / "inception.npz"
    convert_inception.convert(random_state_dict(), str(weights), source_sha256="0" * 64)
    common = [f"--weights={weights}", "--allow_unpinned_weights"]
    ref = tmp_path / "ref.npz"
    gray = pathlib.Path(__file__).resolve().parents[2] / "third_party" / "edm" / "dataset_gray_unlabelled.zip"
    assert main(["ref", f"--data={gray}", f"--dest={ref}", "--batch=6", *common]) == 0
    stored = load_reference(str(ref))
    assert stored["resolution"] == (8, 8) and stored["num_images"] == 6 and stored["mu"].shape == (2048,)
    capsys.readouterr()

    draw = [
        f"--workdir={run}",
        "--preset=cifar10",
        f"--ref={ref}",
        "--num=6",
        "--chunk=4",
        "--batch=1",
        *common,
    ]
    assert main([*draw, f"--outdir={tmp_path / 'whole'}"]) == 0
    whole = json.loads((tmp_path / "whole" / fp.REPORT_FILE).read_text())
    assert main([*draw, f"--outdir={tmp_path / 'cut'}", "--max_chunks=1"]) == 0
    assert "stopped after 1 chunks" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "cut")) == [fp.PROGRESS_FILE]
    # rerunning with other settings into that directory is refused, and leaves it as it was
    before = _tree(tmp_path / "cut")
    assert main([*draw, f"--outdir={tmp_path / 'cut'}", "--first_seed=1"]) == 2
    assert "holds a draw with other settings (first_seed=0; now first_seed=1)" in capsys.readouterr().err
    assert _tree(tmp_path / "cut") == before
    assert main([*draw, f"--outdir={tmp_path / 'cut'}"]) == 0
    captured = capsys.readouterr()
    assert "resuming after 1/2 chunks (4/6 images)" in captured.err and "FID " in captured.out
    resumed = json.loads((tmp_path / "cut" / fp.REPORT_FILE).read_text())
    assert resumed == whole  # the same FID, bit for bit, and the same inputs
    assert whole["num_images"] == 6 and whole["seeds"] == [0, 5] and whole["sampler"]["nfe"] == 35
    assert whole["reference"]["sha256"] == convert_inception.file_sha256(str(ref))
    assert whole["reference"]["resolution"] == [8, 8] and np.isfinite(whole["fid"])
    with np.load(tmp_path / "whole" / fp.STATS_FILE) as a, np.load(tmp_path / "cut" / fp.STATS_FILE) as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_a_damaged_progress_file_is_set_aside_in_one_line_and_redrawn(run, tmp_path, capsys):
    """A progress file whose counts disagree (here chunks_done one past its count, re-digested
    as dew's own writer would), whose bytes do not match their digest, or that is torn (a bad
    CRC-32) is damage dew's own file could suffer: the command sets it aside, says so in one line
    naming it, and draws from the first chunk; it never stops the run."""
    from helpers_fid import random_state_dict

    from dew.fid import main
    from dew.pinned_weights import content_sha256
    from dew.scoring import fid_progress

    weights = tmp_path / "inception.npz"
    convert_inception.convert(random_state_dict(), str(weights), source_sha256="0" * 64)
    ref = tmp_path / "ref.npz"
    save_reference(str(ref), np.zeros(2048), np.eye(2048), resolution=(8, 8), num_images=4, detector="d")
    out = tmp_path / "out"
    out.mkdir()
    argv = [f"--workdir={run}", "--preset=cifar10", f"--ref={ref}", f"--outdir={out}", "--num=8", "--chunk=4"]
    argv += [f"--weights={weights}", "--allow_unpinned_weights"]
    from dew.fid.cli import protocol_args
    from dew.fid.inputs import load_run
    from dew.fid.protocol import protocol_run
    from dew.scoring.fid_detector import weights_detector

    args = protocol_args(argv)
    task, _ = load_run(args.workdir, args.step, args.raw)
    weights = protocol_run(args).weights
    draw = fp.Draw(
        task.objective,
        task.params,
        fp.preset("cifar10"),
        weights_detector(weights.path, pinned=weights.pinned, handling=weights.handling),
        identity={"workdir": os.path.abspath(run), "step": task.step, "raw": False},
        num=8,
        outdir=str(out),
        chunk=4,
    )
    sums = fp.MomentSums()
    sums.add(np.ones((4, 2048)))
    fid_progress.write_progress(str(out), draw.settings(), 1, sums)
    assert fid_progress.read_progress(str(out), draw.settings(), 2048)[0] == 1  # the settings match
    path = out / fid_progress.PROGRESS_FILE
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    original = path.read_bytes()
    for edit, message in (
        ({"chunks_done": np.asarray(2, np.int64)}, "count=4 images after 2 chunks of 4, expected 8"),
        ({"count": np.asarray(3, np.int64)}, "do not match the digest"),
        ({}, "cannot be read (BadZipFile: Bad CRC-32"),
    ):
        changed = {**arrays, **edit}
        if "chunks_done" in edit:
            changed["digest"] = np.asarray(
                content_sha256({k: v for k, v in changed.items() if k != "digest"})
            )
        with open(path, "wb") as f:
            np.savez(f, **changed)
        if not edit:  # a byte of the last member flipped: its CRC-32 no longer holds
            torn = bytearray(original)
            torn[torn.index(b"PK\x01\x02") - 1] ^= 1
            path.write_bytes(bytes(torn))
        damaged = path.read_bytes()
        assert main([*argv, "--max_chunks=1"]) == 0
        lines = [line for line in capsys.readouterr().err.splitlines() if "set it aside" in line]
        assert len(lines) == 1 and message in lines[0] and str(path) in lines[0], lines
        aside = lines[0].split("set it aside as ", 1)[1].split(" and drawing", 1)[0]
        assert pathlib.Path(aside).read_bytes() == damaged
        os.remove(aside)
        assert fid_progress.read_progress(str(out), draw.settings(), 2048)[0] == 1  # drawn again
