"""``python -m dew.fid --preset=... --metrics=fid,sfid,is,precision,recall`` (``dew.fid.protocol``)
on a real (tiny) run: bad input, a reference batch of another resolution and a damaged progress or
chunk file are one line, exit 2, nothing written; and (slow) the whole command with the Inception
network, interrupted and rerun, reports exactly what the uninterrupted command does."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from test_fid_protocol_cli import _tree, run  # noqa: F401  (the module fixture: a tiny trained run)

from dew.scoring import adm_evaluator as adm
from dew.scoring import adm_progress as ap
from dew.scoring import convert_inception

ALL = "--metrics=fid,sfid,is,precision,recall"


def _virtual_batch(path, n: int = 5, size: int = 8, seed: int = 0) -> None:
    """A reference batch in VIRTUAL_imagenet256_labeled.npz's layout: ``arr_0`` uint8 images and
    the pool / spatial statistics, nothing of dew's (no ``pool``, no ``resolution``)."""
    rng = np.random.default_rng(seed)
    pool = np.abs(rng.normal(0.3, 0.5, (n, 2048)))
    spatial = np.abs(rng.normal(0.3, 0.5, (n, 2023)))
    np.savez(
        path,
        arr_0=rng.integers(0, 256, (n, size, size, 3), np.uint8),
        mu=pool.mean(0),
        sigma=np.cov(pool, rowvar=False),
        mu_s=spatial.mean(0),
        sigma_s=np.cov(spatial, rowvar=False),
    )


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and captured.out == "", captured
    return lines[0]


def test_bad_input_is_one_line_exit_2_writing_nothing(run, weights_file, tmp_path, capsys):  # noqa: F811
    from dew.fid import main

    ref = tmp_path / "virtual8.npz"
    _virtual_batch(ref)
    ref16 = tmp_path / "virtual16.npz"
    _virtual_batch(ref16, size=16)
    stats_only = tmp_path / "stats.npz"
    with np.load(ref) as data:
        np.savez(stats_only, **{k: data[k] for k in ("mu", "sigma", "mu_s", "sigma_s")})
    (tmp_path / "folder").mkdir()
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "out"
    ok = [f"--workdir={run}", "--preset=cifar10", f"--ref={ref}", f"--outdir={out}", ALL]
    ok += [f"--weights={weights_file}", "--allow_unpinned_weights", "--num=6", "--chunk=4"]
    cases = [
        ([f"--ref={ref16}"], "is a reference batch at 16x16, the samples are 8x8; ADM's metrics compare"),
        (["--image_handling=pytorch_fid"], "--image_handling=pytorch_fid does not apply to ADM's suite"),
        (["--metrics=fid,fd_dinov2"], "--metrics='fid,fd_dinov2' is invalid with --preset: expected fid, or"),
        (["--metrics=sfid,sfid"], "ADM's suite is a comma-separated subset of fid,sfid,is,precision,recall"),
        ([f"--ref={stats_only}"], "holds statistics only; precision and recall need its arr_0 images"),
        ([f"--ref={tmp_path / 'folder'}"], "is a folder; the protocol takes an ADM reference batch .npz"),
        ([f"--ref={tmp_path / 'none.npz'}"], "does not exist; expected an ADM reference batch .npz"),
        ([f"--ref={tmp_path / 'a_file'}"], "is not an .npz archive"),
        ([f"--weights={tmp_path / 'none.npz'}"], "--weights: FID Inception weights not found"),
        (["--preset=cifar100"], "--preset='cifar100' is not a sampler preset"),
        ([f"--outdir={tmp_path / 'a_file'}"], "is a file; expected a directory"),
        ([f"--workdir={tmp_path / 'folder'}"], "is not a dew run: no run.json"),
    ]
    before = _tree(run), _tree(tmp_path)
    for change, message in cases:
        flags = {a.split("=")[0]: a for a in ok}
        flags.update({a.split("=")[0]: a for a in change})
        assert main(list(flags.values())) == 2, change
        line = _one_line(capsys)
        assert message in line, (change, line)
        assert not out.exists(), change
    assert (_tree(run), _tree(tmp_path)) == before
    # a statistics-only batch serves FID and sFID: the command gets past it (to the weights here)
    flags = {a.split("=")[0]: a for a in ok}
    flags.update({"--ref": f"--ref={stats_only}", "--metrics": "--metrics=fid,sfid"})
    flags["--weights"] = f"--weights={tmp_path / 'none.npz'}"
    assert main(list(flags.values())) == 2
    assert "FID Inception weights not found" in _one_line(capsys)


def _settings(run, argv) -> dict:  # noqa: F811
    """The settings the command's draw records (built as ``dew.fid.protocol.protocol`` builds
    them for ADM's suite)."""
    from dew.fid.cli import protocol_args
    from dew.fid.inputs import load_run
    from dew.fid.protocol import protocol_run
    from dew.scoring import fid_protocol as fp
    from dew.scoring.adm_metrics import weights_scorer
    from dew.scoring.fid_detector import adm_detector

    args = protocol_args(argv)
    task, _ = load_run(run)
    weights = protocol_run(args).weights
    scorer = weights_scorer(weights.path, pinned=weights.pinned, batch=args.batch, flag=weights.flag)
    detector = adm_detector(scorer.params, scorer.digest)
    identity = {"workdir": os.path.abspath(run), "step": task.step, "raw": False}
    flags = {k: getattr(args, k) for k in ("num", "outdir", "first_seed", "batch", "chunk", "preview")}
    return fp.Draw(
        task.objective, task.params, fp.preset("cifar10"), detector, identity=identity, **flags
    ).settings()


def test_a_damaged_progress_or_chunk_file_is_set_aside_in_one_line_and_redrawn(
    run,  # noqa: F811
    weights_file,
    tmp_path,
    capsys,
):
    """A progress file of the command's own settings after one chunk (written by ``AdmTally``
    from stand-in features), then: its chunk file changed, or the progress's digest broken: damage
    dew's own files could suffer, so the command sets the progress aside with one line naming it
    and draws the first chunk again (``--max_chunks=1``); it never stops the run."""
    from dew.fid import main
    from dew.pinned_weights import content_sha256

    ref = tmp_path / "virtual8.npz"
    _virtual_batch(ref)
    out = tmp_path / "out"
    out.mkdir()
    argv = [f"--workdir={run}", "--preset=cifar10", f"--ref={ref}", f"--outdir={out}", ALL]
    argv += [f"--weights={weights_file}", "--allow_unpinned_weights", "--num=8", "--chunk=4"]
    settings = _settings(run, argv)
    tally = ap.AdmTally(8, 4)
    tally.add(0, np.random.default_rng(0).random((4, ap.DIM), np.float32))
    tally.commit(str(out), settings, 1)
    assert ap.AdmTally(8, 4).resume(str(out), settings) == 1  # the command's own settings
    chunk, progress = out / ap.chunk_file(0), out / ap.PROGRESS_FILE
    good_chunk = chunk.read_bytes()
    damaged = bytearray(good_chunk)
    damaged[200] ^= 1
    chunk.write_bytes(bytes(damaged))
    with np.load(progress) as data:
        arrays = {k: data[k] for k in data.files}
    for message in (
        "adm-pool-00000.npy does not match the digest recorded for it",
        "do not match the digest",
    ):
        assert main([*argv, "--max_chunks=1"]) == 0
        lines = [line for line in capsys.readouterr().err.splitlines() if "set it aside" in line]
        assert len(lines) == 1 and message in lines[0] and str(progress) in lines[0], lines
        aside = lines[0].split("set it aside as ", 1)[1].split(" and drawing", 1)[0]
        assert os.path.isfile(aside) and ap.AdmTally(8, 4).read(str(out), settings) == 1  # drawn again
        os.remove(aside)
        arrays["count"] = np.asarray(5, np.int64)
        with open(progress, "wb") as f:
            np.savez(f, **arrays)
    assert content_sha256({k: v for k, v in arrays.items() if k != "digest"}) != str(arrays["digest"])


@pytest.mark.slow  # the Inception network at 299x299 on CPU: ~40 images through it
def test_the_command_interrupted_and_rerun_reports_the_uninterrupted_suite(run, tmp_path, capsys):  # noqa: F811
    """6 images in chunks of 4 against a VIRTUAL-layout batch (its arr_0 embedded for precision
    and recall, its own statistics for FID and sFID): the command stopped after one chunk and
    rerun writes the report and statistics of the command never stopped, bit for bit; the chunk
    files hold the pool features ADM's scorer gives the very images of those seeds."""
    import jax
    import jax.numpy as jnp
    from helpers_fid import random_state_dict
    from test_inception_adm import FEATURE_ATOL

    from dew.fid import main
    from dew.fid.inputs import load_run
    from dew.scoring import fid_protocol as fp
    from dew.scoring.adm_metrics import AdmScorer

    weights = tmp_path / "inception.npz"
    convert_inception.convert(random_state_dict(), str(weights), source_sha256="0" * 64)
    ref = tmp_path / "virtual8.npz"
    _virtual_batch(ref)
    draw = [f"--workdir={run}", "--preset=cifar10", f"--ref={ref}", ALL, "--num=6", "--chunk=4", "--batch=1"]
    draw += [f"--weights={weights}", "--allow_unpinned_weights"]
    assert main([*draw, f"--outdir={tmp_path / 'whole'}"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    whole = json.loads((tmp_path / "whole" / ap.REPORT_FILE).read_text())
    assert [line.split(":")[0] for line in printed[-5:]] == [
        "FID",
        "sFID",
        "Inception Score",
        "Precision",
        "Recall",
    ]
    assert main([*draw, f"--outdir={tmp_path / 'cut'}", "--max_chunks=1"]) == 0
    assert "stopped after 1 chunks" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "cut")) == sorted([ap.PROGRESS_FILE, ap.chunk_file(0)])
    assert main([*draw, f"--outdir={tmp_path / 'cut'}"]) == 0
    assert "resuming after 1/2 chunks (4/6 images)" in capsys.readouterr().err
    resumed = json.loads((tmp_path / "cut" / ap.REPORT_FILE).read_text())
    assert resumed == whole  # every metric bit for bit, and the same inputs
    assert list(whole)[:5] == ["fid", "sfid", "is", "precision", "recall"]
    assert whole["num_images"] == 6 and whole["seeds"] == [0, 5] and whole["sampler"]["nfe"] == 35
    assert whole["reference"]["sha256"] == convert_inception.file_sha256(str(ref))
    assert whole["reference"]["resolution"] == [8, 8] and whole["reference"]["num_images"] == 5
    assert whole["fid"] > 0 and whole["sfid"] > 0 and whole["is"] >= 1
    assert all(0 <= whole[k] <= 1 for k in ("precision", "recall"))
    with np.load(tmp_path / "whole" / ap.STATS_FILE) as a, np.load(tmp_path / "cut" / ap.STATS_FILE) as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
    back = adm.read_reference_batch(str(tmp_path / "whole" / ap.STATS_FILE))
    assert back["resolution"] == (8, 8) and back["num_images"] == 6
    # the chunk files: the pool rows of seeds 0..5's images as ADM's scorer embeds them (another
    # program, another batch: test_inception_adm's bound for another summation order)
    task, _ = load_run(run)
    images = np.asarray(
        jax.jit(lambda p, s: fp.draw_images(task.objective, p, s, fp.preset("cifar10")))(
            task.params, jnp.arange(6, dtype=jnp.int32)
        )
    )
    pool, _ = AdmScorer(str(weights), pinned=False, batch=6).features(np.repeat(images, 3, axis=-1))
    rows = np.concatenate([np.load(tmp_path / "cut" / ap.chunk_file(i)) for i in range(2)])
    np.testing.assert_allclose(rows, pool, atol=FEATURE_ATOL, rtol=FEATURE_ATOL)


def test_a_bad_reference_batch_is_refused_before_the_run_is_loaded(run, tmp_path, capsys, monkeypatch):  # noqa: F811
    """The protocol and the ``--workdir`` suite read ``--ref`` before they restore the run; only
    the resolution, which the run gives, is checked after."""
    import dew.fid.inputs
    import dew.fid.protocol
    from dew.fid import main

    def load_run(*args, **kwargs):
        raise AssertionError("the run was loaded before --ref was read")

    monkeypatch.setattr(dew.fid.protocol, "load_run", load_run)
    monkeypatch.setattr(dew.fid.inputs, "load_run", load_run)
    stats_only = tmp_path / "stats.npz"
    _virtual_batch(tmp_path / "virtual8.npz")
    with np.load(tmp_path / "virtual8.npz") as data:
        np.savez(stats_only, **{k: data[k] for k in ("mu", "sigma", "mu_s", "sigma_s")})
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "out"
    modes = (
        [f"--workdir={run}", "--preset=cifar10", f"--outdir={out}", ALL],  # the protocol
        [f"--workdir={run}", "--num_samples=6", ALL],  # ADM's suite of the run's samples
    )
    for mode in modes:
        for ref, message in (
            (tmp_path / "none.npz", "does not exist; expected an ADM reference batch .npz"),
            (tmp_path / "a_file", "is not an .npz archive"),
            (stats_only, "holds statistics only; precision and recall need its arr_0 images"),
        ):
            assert main([*mode, f"--ref={ref}"]) == 2, (mode, ref)
            assert message in _one_line(capsys), (mode, ref)
    assert not out.exists()
