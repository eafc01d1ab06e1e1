"""``python -m dew.fid --metrics=fid,sfid,is,precision,recall`` (ADM's suite, ``dew.fid.adm_cli``):
bad input is one line, exit 2, nothing written (a reference batch of another resolution among
it); end to end on folders, a reference batch it writes is read back to the same numbers."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from PIL import Image

from dew.scoring import adm_evaluator as adm

ALL = "--metrics=fid,sfid,is,precision,recall"


def _folder(path, n: int, size=(8, 8), seed=0):
    path.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (*size, 3), np.uint8)).save(path / f"{i:03d}.png")
    return path


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and captured.out == "", captured
    return lines[0]


def test_bad_input_is_one_line_exit_2_writing_nothing(weights_file, tmp_path, capsys):
    from dew.fid import main

    images = _folder(tmp_path / "images", 4)
    batch16 = tmp_path / "batch16.npz"
    np.savez(batch16, arr_0=np.zeros((4, 16, 16, 3), np.uint8))
    stats_only = tmp_path / "stats.npz"
    np.savez(stats_only, mu=np.zeros(2048), sigma=np.eye(2048), mu_s=np.zeros(2023), sigma_s=np.eye(2023))
    out = tmp_path / "out.npz"
    common = [f"--images={images}", f"--weights={weights_file}", "--allow_unpinned_weights"]
    hostile = {  # what an attack round found: tracebacks, or precision and recall 0.0 with exit 0
        "mu_only": (
            {"arr_0": np.zeros((4, 8, 8, 3), np.uint8), "mu": np.zeros(2048)},
            "holds mu without sigma; expected both or neither",
        ),
        "garbage": (None, "member 'arr_0' cannot be read (ValueError: the magic string is not correct"),
        "num_array": (
            {"arr_0": np.zeros((4, 8, 8, 3), np.uint8), "num_images": np.array([4, 4])},
            "member 'num_images' has shape (2,); expected int/uint []",
        ),
        "one_image": (
            {"arr_0": np.zeros((1, 8, 8, 3), np.uint8)},
            "holds 1 images; statistics need at least 2",
        ),
        "three": ({"arr_0": np.zeros((3, 8, 8, 3), np.uint8)}, "precision and recall need at least 4"),
        "nan_pool": (
            {"arr_0": np.zeros((4, 8, 8, 3), np.uint8), "pool": np.full((4, 2048), np.nan, np.float32)},
            "pool holds feature rows that are not finite",
        ),
        "says_8": (
            {"arr_0": np.zeros((4, 16, 16, 3), np.uint8), "resolution": np.array([8, 8])},
            "records resolution 8x8, its arr_0 holds 16x16 images",
        ),
    }
    for name, (arrays, _) in hostile.items():
        if arrays is None:
            with zipfile.ZipFile(tmp_path / f"{name}.npz", "w") as archive:
                archive.writestr("arr_0.npy", b"not an array" * 20)
        else:
            np.savez(tmp_path / f"{name}.npz", **arrays)
    cases = [
        *(([ALL, f"--ref={tmp_path / name}.npz"], message) for name, (_, message) in hostile.items()),
        ([ALL, f"--ref={batch16}"], "is a reference batch at 16x16, the samples are 8x8"),
        ([ALL, f"--ref={stats_only}"], "holds statistics only; precision and recall need its arr_0"),
        (["--metrics=fid,sfid,fd_dinov2", f"--ref={batch16}"], "ADM's suite is a comma-separated subset"),
        (["--metrics=sfid,sfid", f"--ref={batch16}"], "without repeats"),
        ([ALL, f"--ref={batch16}", "--kid"], "--kid do not apply to ADM's suite"),
        ([ALL], "give --ref=<ADM reference batch .npz or folder> or --save_ref_batch"),
        ([ALL, f"--ref={tmp_path / 'none.npz'}"], "does not exist; expected an ADM reference batch"),
        ([ALL, f"--ref={images / '000.png'}"], "is not an .npz archive"),
        ([ALL, f"--save_ref_batch={tmp_path}"], "expected a path ending in .npz"),
        (["--metrics=fid", f"--save_ref_batch={out}", f"--ref={batch16}"], "--save_ref_batch applies to ADM"),
        ([ALL, f"--ref={batch16}", "--pr_arithmetic=float64"], "--pr_arithmetic: invalid choice: 'float64'"),
    ]
    for change, message in cases:
        assert main([*common, *change]) == 2, change
        line = _one_line(capsys)
        assert message in line, (change, line)
    assert not out.exists()
    assert main([*common, ALL, f"--ref={stats_only}", f"--weights={tmp_path / 'none.npz'}"]) == 2
    assert "precision and recall need" in _one_line(capsys)
    assert (
        main([*common[:1], "--metrics=sfid", f"--ref={stats_only}", f"--weights={tmp_path / 'w.npz'}"]) == 2
    )
    assert "FID Inception weights not found" in _one_line(capsys)


@pytest.mark.slow  # the Inception network at 299x299 on CPU, 10 images
def test_the_suite_end_to_end_and_its_reference_batch_read_back(weights_file, tmp_path, capsys, monkeypatch):
    from dew.fid import main

    samples = _folder(tmp_path / "samples", 5, seed=1)
    real = _folder(tmp_path / "real", 5, seed=2)
    common = [ALL, f"--weights={weights_file}", "--allow_unpinned_weights", "--batch_size=4"]
    batch = tmp_path / "ref_batch.npz"
    assert main([f"--images={real}", f"--save_ref_batch={batch}", *common]) == 0
    capsys.readouterr()
    stored = adm.read_reference_batch(str(batch))
    assert stored["resolution"] == (8, 8) and stored["num_images"] == 5 and stored["pool"].shape == (5, 2048)
    assert stored["mu_s"].shape == (2023,)
    first = np.concatenate(list(stored["images"].batches(2)))
    np.testing.assert_array_equal(first[0], np.asarray(Image.open(real / "000.png")))

    def scores(ref) -> dict[str, float]:
        assert main([f"--images={samples}", f"--ref={ref}", *common]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[0] == f"5 images in {samples}"
        return {k: float(v) for k, v in (line.rsplit(": ", 1) for line in lines[1:])}

    from_folder, from_batch = scores(real), scores(batch)
    assert list(from_folder) == ["FID", "sFID", "Inception Score", "Precision", "Recall"]
    assert from_folder == from_batch  # the batch holds exactly what the folder gives
    assert from_folder["FID"] > 0 and from_folder["sFID"] > 0 and from_folder["Inception Score"] >= 1
    assert all(0 <= from_folder[k] <= 1 for k in ("Precision", "Recall"))
    # the evaluator reads a batch of images only (no dew keys) the same way: embedded arr_0
    plain = tmp_path / "plain.npz"
    np.savez(plain, arr_0=first)
    assert scores(plain) == from_folder
    # --pr_arithmetic reaches precision and recall (float16, the evaluator's graph, by default)
    asked, computed = [], adm.precision_recall

    def recording(reference, samples, estimator=None, arithmetic="float16"):
        asked.append(arithmetic)
        return computed(reference, samples, estimator, arithmetic)

    monkeypatch.setattr(adm, "precision_recall", recording)
    assert scores(batch) == from_folder and asked == ["float16"]
    common.append("--pr_arithmetic=float32")
    float32 = scores(batch)
    assert asked == ["float16", "float32"]
    assert {k: v for k, v in float32.items() if k not in ("Precision", "Recall")} == {
        k: v for k, v in from_folder.items() if k not in ("Precision", "Recall")
    }
