"""Converted Inception weights (pinned, digested) and ``python -m dew.fid`` end to end, on folders
of images and on a (tiny) run's samples drawn through ``dew.pipeline``."""

from __future__ import annotations

import os
import pathlib

import jax
import numpy as np
import pytest
from PIL import Image
from test_pipeline import ROOT, TINY_EDM, Capture

import dew
from dew.config import apply_overrides, load_config
from dew.scoring import convert_inception, distances, inception
from dew.scoring.inception_metrics import InceptionScorer
from dew.scoring.statistics import FeatureStatistics, save_statistics
from dew.training.trainer import Trainer


def test_weights_are_pinned_digested_and_explained_when_missing(weights_file, tmp_path, monkeypatch):
    with np.load(weights_file) as data:
        assert "fc.bias" not in data.files and not any(k.endswith("num_batches_tracked") for k in data.files)
        assert data["fc.weight"].shape == (1008, 2048)  # kept for ADM's Inception Score
    with pytest.raises(ValueError, match=r"not the standard pt_inception-2015-12-05-6726825d\.pth"):
        convert_inception.load_weights(str(weights_file))
    params = convert_inception.load_weights(str(weights_file), pinned=False)
    assert set(params) == set(inception._expected_shapes())
    # a changed array with the old digest is refused
    with np.load(weights_file) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["Conv2d_1a_3x3.conv.weight"] = arrays["Conv2d_1a_3x3.conv.weight"] * 1.001
    damaged = tmp_path / "damaged.npz"
    np.savez(damaged, **arrays)
    with pytest.raises(ValueError, match="damaged"):
        convert_inception.load_weights(str(damaged), pinned=False)
    monkeypatch.setenv(convert_inception.ENV_VAR, str(tmp_path / "absent.npz"))
    with pytest.raises(FileNotFoundError, match=r"mseitzer/pytorch-fid.*dew\.scoring\.convert_inception"):
        convert_inception.load_weights()
    # the converter itself refuses a file that is not the pinned one
    fake = tmp_path / "fake.pth"
    fake.write_bytes(b"not the weights")
    assert convert_inception.main([f"--input={fake}", f"--output={tmp_path / 'o.npz'}"]) == 2
    assert not (tmp_path / "o.npz").exists()


def _write_pngs(folder: pathlib.Path, images: np.ndarray) -> None:
    folder.mkdir()
    for i, img in enumerate(images):
        Image.fromarray(img).save(folder / f"{i:03d}.png")


@pytest.mark.slow
def test_fid_cli_on_folders_matches_the_library(weights_file, tmp_path, capsys, monkeypatch):
    from dew.fid import main

    shapes = set()  # the batch sizes the Inception is called at: one, so one compiled program
    features = InceptionScorer.features
    monkeypatch.setattr(
        InceptionScorer, "features", lambda self, x, *a, **k: shapes.add(len(x)) or features(self, x, *a, **k)
    )
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (5, 24, 24, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-60, 60, a.shape), 0, 255).astype(np.uint8)
    _write_pngs(tmp_path / "a", a)
    _write_pngs(tmp_path / "b", b)
    common = [f"--weights={weights_file}", "--allow_unpinned_weights", "--batch_size=3"]
    stats_path = tmp_path / "a_stats.npz"
    assert (
        main([f"--images={tmp_path / 'a'}", f"--save_stats={stats_path}", "--keep_features=5", *common]) == 0
    )
    assert main([f"--images={tmp_path / 'b'}", f"--ref={stats_path}", "--kid", *common]) == 0
    out = capsys.readouterr().out
    fid = float(out.split("FID ")[1].split()[0])
    # the same thing through the library: features of both sets in one batch each
    params = convert_inception.load_weights(str(weights_file), pinned=False)
    feats = [
        np.asarray(jax.jit(inception.features, static_argnames="value_range")(params, x / 255.0, (0.0, 1.0)))
        for x in (a.astype(np.float32), b.astype(np.float32))
    ]
    sa, sb = FeatureStatistics().update(feats[0]), FeatureStatistics().update(feats[1])
    expected = distances.frechet_distance(sb.mu, sb.sigma, sa.mu, sa.sigma)
    assert fid == pytest.approx(expected, rel=1e-3, abs=1e-3)
    assert "KID " in out
    assert shapes == {3}  # 5 images at --batch_size=3: the last batch padded to 3

    # bad input: exit 2, one line each, nothing written
    _write_pngs(tmp_path / "mixed", np.zeros((2, 24, 24, 3), np.uint8))
    Image.fromarray(np.zeros((30, 24, 3), np.uint8)).save(tmp_path / "mixed" / "z.png")
    bad = [
        [f"--images={tmp_path / 'nope'}", f"--ref={stats_path}", *common],
        [f"--images={tmp_path / 'a'}", f"--ref={stats_path}", f"--weights={tmp_path / 'none.npz'}"],
        [f"--images={tmp_path / 'a'}", f"--ref={tmp_path / 'missing.npz'}", *common],
        [f"--images={tmp_path / 'mixed'}", f"--ref={stats_path}", *common],
        [f"--workdir={tmp_path}", f"--ref={stats_path}", *common],
    ]
    for argv in bad:
        assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(bad) and all(line.startswith("error: ") for line in err), err
    assert "convert_inception" in err[1] and "z.png is 24x30" in err[3] and "is not a dew run" in err[4]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    """A tiny trained EDM run (8x8 grey digits, 10 classes, one checkpoint at step 3)."""
    workdir = str(tmp_path_factory.mktemp("edm") / "run")
    config = apply_overrides(load_config(str(ROOT / "experiments" / "edm.py")), TINY_EDM)
    Trainer(config, workdir, [Capture()]).run()
    return workdir


@pytest.fixture(scope="module")
def grey_reference(weights_file, tmp_path_factory) -> pathlib.Path:
    """Reference statistics (with features) of 5 random grey 8x8 images in [-1, 1]."""
    scorer = InceptionScorer(weights_path=str(weights_file), pinned=False)
    real = np.random.default_rng(0).uniform(-1, 1, (5, 8, 8, 1)).astype(np.float32)
    stats = scorer.statistics([real], keep_features=5)
    path = tmp_path_factory.mktemp("ref") / "ref.npz"
    save_statistics(str(path), stats.mu, stats.sigma, stats.features)
    return path


@pytest.mark.slow  # ~100 s on 2 loaded cores: two 2048-d Fréchet distances (eigh, svd) dominate
def test_fid_of_a_run_is_the_fid_of_its_pipelines_samples(run, weights_file, grey_reference, capsys):
    from dew.fid import main

    common = [f"--weights={weights_file}", "--allow_unpinned_weights", "--batch_size=5"]
    argv = [f"--workdir={run}", "--num_samples=15", "--seed=4", f"--ref={grey_reference}", "--kid"]
    assert main([*argv, *common]) == 0
    captured = capsys.readouterr()
    fid = float(captured.out.split("FID ")[1].split()[0])
    assert captured.out.startswith("15 samples from Pipeline(Diffusion, step 3, EMA weights")
    assert "KID " in captured.out and "fid: 15/15 samples" in captured.err
    # the same samples drawn directly: draw i with seed 4 + i, each all 10 classes (one per class,
    # the run's preview settings), the second cut to the 5 still needed; grey, as the run draws them
    task = dew.pipeline(run)
    images = np.concatenate([task(seed=4).images, task(seed=5).images[:5]])
    assert images.shape == (15, 8, 8, 1)
    scorer = InceptionScorer(weights_path=str(weights_file), pinned=False)
    stats = scorer.statistics([images[i : i + 5] for i in range(0, 15, 5)], (-1.0, 1.0))
    with np.load(grey_reference) as ref:
        expected = distances.frechet_distance(stats.mu, stats.sigma, ref["mu"], ref["sigma"])
    assert fid == pytest.approx(expected, rel=1e-6)  # float64 statistics of the same features


def _tree(folder: str) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under folder, by relative path."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            info = os.stat(os.path.join(root, name))
            found[os.path.relpath(os.path.join(root, name), folder)] = (info.st_size, info.st_mtime_ns)
    return found


def test_bad_workdir_input_exits_2_with_one_line_naming_it_and_writes_nothing(
    run, weights_file, grey_reference, tmp_path, capsys
):
    from dew.fid import main

    before = _tree(run)
    out = tmp_path / "stats.npz"
    common = [f"--ref={grey_reference}", f"--save_stats={out}", f"--weights={weights_file}"]
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ([f"--workdir={empty}"], "is not a dew run: no run.json"),
        ([f"--workdir={tmp_path / 'missing'}"], "is not a directory"),
        ([f"--workdir={run}", "--step=12"], "--step=12: ", "has no checkpoint at step 12; it has steps [3]"),
        ([f"--workdir={run}", "--step=last"], "argument --step: invalid int value: 'last'"),
        ([f"--workdir={run}", "--num_samples=1"], "--num_samples=1: need at least 2 samples"),
        ([f"--workdir={run}", f"--images={empty}"], "--images: not allowed with argument --workdir"),
        ([f"--images={empty}", "--num_samples=10"], "--num_samples only apply with --workdir"),
    ]
    for argv, *messages in cases:
        assert main([*argv, *common]) == 2, argv
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, captured.err)
        assert all(m in lines[0] for m in messages), (argv, lines[0])
        assert captured.out == "" and not out.exists(), argv
    assert _tree(run) == before and os.listdir(empty) == []


def test_weights_that_are_not_an_npz_are_refused_before_the_run_is_loaded(run, tmp_path, capsys, monkeypatch):
    """The score mode opens the FID Inception weights' archive before the checkpoint is restored."""
    import dew.fid.inputs
    from dew.fid import main

    def load_run(*args, **kwargs):
        raise AssertionError("the run was loaded before the weights were checked")

    monkeypatch.setattr(dew.fid.inputs, "load_run", load_run)
    bad, out = tmp_path / "weights.pth", tmp_path / "stats.npz"
    bad.write_bytes(b"\x80\x02 a pickle, not the converted weights")
    assert main([f"--workdir={run}", f"--weights={bad}", f"--save_stats={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --weights: FID Inception weights: {bad} is not an .npz archive")
    assert err.endswith("convert them with python -m dew.scoring.convert_inception") and not out.exists()


_LOAD_RUN_WATCHED = """
import sys

import dew.fid.inputs as inputs
from dew.runtime import platform

load_run = inputs.load_run


def watched(*args, **kwargs):
    print(f"platform started before the run was loaded: {platform.started() is not None}", file=sys.stderr)
    return load_run(*args, **kwargs)


inputs.load_run = watched
from dew.fid import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # a fresh process: JAX, the run and the Inception compiled
def test_the_platform_is_started_before_the_run_is_loaded(run, weights_file, tmp_path):
    """``python -m dew.fid`` starts the platform (``dew.runtime.platform.start_for``) once its
    flags are checked, not through the run's pipeline: the score mode on a run has it before
    the run is loaded."""
    import subprocess
    import sys

    out = tmp_path / "stats.npz"
    argv = [f"--workdir={run}", "--num_samples=2", "--batch_size=2", f"--save_stats={out}"]
    argv += [f"--weights={weights_file}", "--allow_unpinned_weights"]
    child = subprocess.run(
        [sys.executable, "-c", _LOAD_RUN_WATCHED, *argv], capture_output=True, text=True, cwd=ROOT
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "platform started before the run was loaded: True" in child.stderr
    assert out.exists()


@pytest.mark.slow  # a fresh process compiles the Inception
def test_a_mode_without_a_run_keeps_its_compiled_programs(weights_file, tmp_path):
    """``python -m dew.fid`` starts the platform at launch, as ``python -m dew.sample`` does, so
    ``ref`` (which loads no run) keeps its compiled programs in the machine's cache for the next
    command (on an accelerator the Inception's compile is most of a short command)."""
    import subprocess
    import sys

    _write_pngs(tmp_path / "data", np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8))
    env = {**os.environ, "DEW_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    argv = ["ref", f"--data={tmp_path / 'data'}", f"--dest={tmp_path / 'ref.npz'}", "--batch=2"]
    argv += [f"--weights={weights_file}", "--allow_unpinned_weights"]
    child = subprocess.run(
        [sys.executable, "-m", "dew.fid", *argv], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert (tmp_path / "ref.npz").exists()
    cache = tmp_path / "cache" / "jax"
    assert cache.is_dir() and os.listdir(cache), "no compiled program kept"
