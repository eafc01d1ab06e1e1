"""Converted Inception weights (pinned, digested) and ``python -m dew.fid`` end to end."""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import numpy as np
import pytest
from PIL import Image

from dew.scoring import convert_inception, distances, inception
from dew.scoring.statistics import FeatureStatistics

HERE = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "pytorch_fid"


def _random_state_dict() -> dict[str, np.ndarray]:
    """The parity test's deterministic weights under PyTorch names, plus what the official file
    also holds and the converter drops (classifier head, batch counters)."""
    spec = importlib.util.spec_from_file_location("pytorch_fid_weights", HERE / "weights.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with np.load(HERE / "inception_reference.npz") as ref:
        arrays = {k[len("bn/") :]: ref[k] for k in ref.files if k.startswith("bn/")}
    for path, leaves in inception._expected_shapes().items():
        name = path[len("inception_fid/") :].replace("/", ".")
        h, w, i, o = leaves["w"]
        arrays[name + ".conv.weight"] = gen.conv_weight(name + ".conv.weight", (o, i, h, w))
        arrays[name + ".bn.num_batches_tracked"] = np.array(0)
    arrays["fc.weight"] = np.zeros((1008, 2048), np.float32)
    return arrays


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "inception.npz"
    convert_inception.convert(_random_state_dict(), str(path), source_sha256="0" * 64)
    return path


def test_weights_are_pinned_digested_and_explained_when_missing(weights_file, tmp_path, monkeypatch):
    with np.load(weights_file) as data:
        assert "fc.weight" not in data.files and not any(
            k.endswith("num_batches_tracked") for k in data.files
        )
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
def test_fid_cli_on_folders_matches_the_library(weights_file, tmp_path, capsys):
    from dew.fid import main

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
    assert fid == pytest.approx(expected, rel=1e-3, abs=1e-3)  # printed to 4 decimals
    assert "KID " in out

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
    assert "convert_inception" in err[1] and "z.png is 24x30" in err[3] and "dew.pipeline" in err[4]
