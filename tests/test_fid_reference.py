"""``python -m dew.fid ref``'s statistics against NVlabs/edm's own ``fid.py ref`` (goldens from
``third_party/edm/make_fid_reference.py``), reference files in its format both ways, and the
reference command's bad input."""

from __future__ import annotations

import os
import pathlib
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest

from dew.scoring.fid_detector import Detector, check_reference
from dew.scoring.fid_reference import (
    FidInputError,
    MomentSums,
    dataset_files,
    load_reference,
    reference_statistics,
    save_reference,
)

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

EDM = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "edm"
CASES = {
    "rgb12x10": EDM / "fid_images_rgb12x10.zip",
    "rgb_labels": EDM / "dataset_rgb_labels.zip",
    "gray": EDM / "dataset_gray_unlabelled.zip",
}


def projection_detector(projection: np.ndarray, columns: np.ndarray) -> Detector:
    """The golden's stand-in detector in JAX: uint8 NHWC -> NCHW, flattened, times the integer
    matrix placed in ``columns`` of 2048 features (exact in float32: integers below 2**24)."""
    full = np.zeros((projection.shape[0], 2048), np.float32)
    full[:, columns] = projection

    def fn(matrix, images):
        x = jnp.transpose(images, (0, 3, 1, 2)).astype(jnp.float32)
        return x.reshape(x.shape[0], -1) @ matrix

    return Detector(fn, jnp.asarray(full), 2048, "projection (test)")


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_statistics_equal_nvlabs_fid_py_ref(case, tmp_path):
    golden = np.load(EDM / "fid_reference.npz")
    columns = golden["columns"]
    detector = projection_detector(golden[f"{case}/projection"], columns)
    sources = [str(CASES[case])]
    if case == "rgb12x10":  # the reference read the folder; dew reads the zip and the folder
        with zipfile.ZipFile(CASES[case]) as z:
            z.extractall(tmp_path / "folder")
        sources.append(str(tmp_path / "folder"))
    for source in sources:
        sums, resolution = reference_statistics(dataset_files(source), detector, batch=4)
        mu, sigma = sums.mu_sigma()
        assert resolution == ((12, 10) if case == "rgb12x10" else (8, 8))
        # Every feature is an integer the float32 matmul holds exactly, every float64 sum an
        # integer below 2**53, and mu, sigma follow from them by the reference's own sequence
        # of correctly rounded operations (mu = Σf / n; (Σffᵀ − n μμᵀ) / (n − 1)): equal bits.
        np.testing.assert_array_equal(mu[columns], golden[f"{case}/mu"])
        np.testing.assert_array_equal(sigma[np.ix_(columns, columns)], golden[f"{case}/sigma"])
        rest = np.setdiff1d(np.arange(2048), columns)
        assert not mu[rest].any() and not sigma[rest].any() and not sigma[:, rest].any()


def test_reference_files_load_both_ways(tmp_path):
    rng = np.random.default_rng(0)
    mu, sigma = rng.normal(size=5), np.eye(5)
    # the reference's own `ref` writes np.savez(dest, mu=mu, sigma=sigma): it loads, no resolution
    theirs = tmp_path / "nvlabs.npz"
    np.savez(theirs, mu=mu, sigma=sigma)
    loaded = load_reference(str(theirs))
    assert set(loaded) == {"mu", "sigma"} and np.array_equal(loaded["mu"], mu)
    check_reference(loaded, str(theirs), (32, 32), 5)  # no provenance: any resolution
    # dew's file: the reference's `calc` reads it with dict(np.load(f)) (no pickle) for mu/sigma
    ours = tmp_path / "dew.npz"
    save_reference(str(ours), mu, sigma, resolution=(12, 10), num_images=9, detector="d")
    with open(ours, "rb") as f:
        as_calc_reads_it = dict(np.load(f))
    assert np.array_equal(as_calc_reads_it["mu"], mu) and np.array_equal(as_calc_reads_it["sigma"], sigma)
    loaded = load_reference(str(ours))
    assert loaded["resolution"] == (12, 10) and loaded["num_images"] == 9
    check_reference(loaded, str(ours), (12, 10), 5)
    with pytest.raises(FidInputError, match=r"computed at resolution 12x10, the samples are 32x32"):
        check_reference(loaded, str(ours), (32, 32), 5)
    with pytest.raises(FidInputError, match=r"holds 5-d statistics; the detector gives 2048-d"):
        check_reference(loaded, str(ours), (12, 10), 2048)
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]  # the atomic write left nothing


def test_moment_sums_follow_the_reference_formula():
    x = np.random.default_rng(1).normal(3.0, 2.0, (50, 4))
    sums = MomentSums()
    for part in np.array_split(x, 7):
        sums.add(part)
    mu, sigma = sums.mu_sigma()
    # float64 sums of 50 rows of size ~5: the naive formula's error is ~ n u |x|² (u = 2**-53)
    bound = 50 * 2.0**-53 * np.max(np.abs(x)) ** 2 * 10
    np.testing.assert_allclose(mu, x.mean(0), rtol=0, atol=bound)
    np.testing.assert_allclose(sigma, np.cov(x, rowvar=False), rtol=0, atol=bound)
    with pytest.raises(ValueError, match="at least 2 images"):
        MomentSums().mu_sigma()


def _tree(folder: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_ref_command_bad_input_is_one_line_exit_2_writing_nothing(tmp_path, capsys):
    from dew.fid import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not an image")
    (tmp_path / "one").mkdir()
    with zipfile.ZipFile(CASES["gray"]) as z:
        (tmp_path / "one" / "x.png").write_bytes(
            z.read(sorted(n for n in z.namelist() if n.endswith(".png"))[0])
        )
    dest = tmp_path / "out" / "ref.npz"
    before = _tree(tmp_path)
    cases = [
        ([f"--data={tmp_path / 'missing'}"], "does not exist"),
        ([f"--data={tmp_path / 'empty'}"], "holds no image files"),
        ([f"--data={tmp_path / 'notes'}"], "holds no image files"),
        ([f"--data={tmp_path / 'one'}"], "holds 1 image; need at least 2"),
        ([f"--data={tmp_path / 'notes' / 'a.txt'}"], "is neither a directory nor a .zip"),
        ([f"--data={CASES['gray']}", "--batch=0"], "--batch=0 is invalid"),
        (
            [f"--data={CASES['gray']}", f"--weights={tmp_path / 'none.npz'}"],
            "FID Inception weights not found",
        ),
    ]
    for argv, message in cases:
        assert main(["ref", *argv, f"--dest={dest}"]) == 2, argv
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (argv, lines)
        assert captured.out == ""
    assert main(["ref", f"--data={CASES['gray']}", f"--dest={tmp_path / 'ref.txt'}"]) == 2
    assert "--dest=" in capsys.readouterr().err
    assert _tree(tmp_path) == before
