"""NVlabs/edm's ``fid.py ref``, run by its own code on small image sets, for dew's reference
statistics test (``tests/test_fid_reference.py``). Run with PyTorch:

    /work/venv-torch/bin/python third_party/edm/make_fid_reference.py [--edm=/work/ref/edm]

The reference loads its detector, StyleGAN3's TorchScript Inception, from a URL; this machine
cannot reach it, and dew's Inception is the pytorch-fid port (checked against pytorch-fid in
``third_party/pytorch_fid``), not that TorchScript file. So the detector is replaced, on both
sides, by one feature function both compute exactly: ``Projection``, the uint8 NCHW images as
float32, flattened (C, H, W order), times a fixed integer matrix with entries in {-2, …, 2}
(``projection`` [3·H·W, 8], stored). Every product and sum is an integer below 2²⁴, so float32
holds it exactly in any summation order. The reference's code is served this module where it
expects the pickle (``dnnlib.util.open_url`` answers with its pickled bytes); everything else is
the reference's: the ``ref`` command (its ``np.savez(dest, mu=mu, sigma=sigma)``),
``calculate_inception_stats`` (its ``ImageFolderDataset`` listing and decoding, batching over
``--batch``, the greyscale ``repeat([1, 3, 1, 1])``, float64 ``mu``/``sigma`` accumulation and
normalisation), on a one-process gloo group, CPU, one loader worker.

Cases (``--batch=4``, so each has a partial last batch):

* ``rgb12x10``: 9 RGB images of 12 rows × 10 columns (not square, so a transposed layout shows),
  seeded noise, PNGs in a folder (also read as a zip of that folder: the same statistics);
* ``rgb_labels``: ``dataset_rgb_labels.zip`` (10 RGB 8×8 in class folders, ``dataset.json``),
  written earlier by the reference's ``dataset_tool.py`` (``make_dataset_reference.py``);
* ``gray``: ``dataset_gray_unlabelled.zip`` (6 greyscale 8×8, channel repeated to three).

Writes ``fid_images_rgb12x10.zip`` (the generated PNGs, stored uncompressed) and
``fid_reference.npz``: ``columns`` (the projection's nonzero feature columns of the 2048 that
``calculate_inception_stats`` fixes), and per case ``<case>/projection`` int8 [3·H·W, 8],
``<case>/mu`` [8] and ``<case>/sigma`` [8, 8] (float64), the ``columns`` block of what the
reference's ``ref`` command saved (it saved exactly ``mu`` [2048] and ``sigma`` [2048, 2048],
float64, zero outside the block: the script asserts it), and ``rgb12x10/zip_matches_folder``.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import shutil
import sys
import tempfile
import zipfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FEATURES = 2048  # calculate_inception_stats's feature_dim, fixed in its code
COLUMNS = (0, 1, 300, 777, 1024, 1500, 2046, 2047)  # the projection's nonzero feature columns
BATCH = 4


class Projection(torch.nn.Module):
    """The stand-in detector: forward(uint8 NCHW, return_features=True) -> float32 [N, 2048],
    nonzero in ``COLUMNS`` only (``matrix`` [3·H·W, 8] placed there)."""

    def __init__(self, matrix: np.ndarray):
        super().__init__()
        full = np.zeros((matrix.shape[0], FEATURES), np.float32)
        full[:, list(COLUMNS)] = matrix
        self.register_buffer("matrix", torch.from_numpy(full))

    def forward(self, images, return_features=True):
        assert images.dtype == torch.uint8 and return_features
        return images.to(torch.float32).reshape(images.shape[0], -1) @ self.matrix


def projection_matrix(channels_hw: int, case: str) -> np.ndarray:
    """Integers in {-2, …, 2}, seeded by the case name (stored; the test reads them back)."""
    seed = sum(case.encode())
    return np.random.default_rng(seed).integers(-2, 3, (channels_hw, len(COLUMNS))).astype(np.int8)


def write_pngs(folder: str) -> None:
    import PIL.Image

    os.makedirs(folder)
    rng = np.random.default_rng(3131)
    for i in range(9):
        PIL.Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8), "RGB").save(
            os.path.join(folder, f"img{i:03d}.png")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edm", default="/work/ref/edm", help="an NVlabs/edm checkout (copied, not changed)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="edm_fid_ref_")
    edm = os.path.join(work, "edm")
    shutil.copytree(args.edm, edm, ignore=shutil.ignore_patterns(".git"))
    sys.path.insert(0, edm)
    torch.set_num_threads(1)
    import dnnlib
    import fid  # the reference's fid.py
    from torch_utils import distributed as dist

    served: dict[str, bytes] = {}
    dnnlib.util.open_url = lambda url, **kwargs: io.BytesIO(served["detector"])

    def init_cpu_group() -> None:  # dist.init() asks for NCCL and CUDA; one gloo process instead
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{os.path.join(work, 'pg')}", rank=0, world_size=1
        )

    dist.init = init_cpu_group
    defaults = list(fid.calculate_inception_stats.__defaults__)
    defaults[3], defaults[5] = 1, torch.device("cpu")  # num_workers, device
    fid.calculate_inception_stats.__defaults__ = tuple(defaults)
    torch.multiprocessing.set_start_method = lambda *a, **k: None  # keep fork: the served pickle

    images = os.path.join(work, "rgb12x10")
    write_pngs(images)
    archive = os.path.join(HERE, "fid_images_rgb12x10.zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for name in sorted(os.listdir(images)):  # a fixed timestamp: the same bytes every run
            with open(os.path.join(images, name), "rb") as f:
                z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), f.read())
    cases = {
        "rgb12x10": (images, 3 * 12 * 10),
        "rgb_labels": (os.path.join(HERE, "dataset_rgb_labels.zip"), 3 * 8 * 8),
        "gray": (os.path.join(HERE, "dataset_gray_unlabelled.zip"), 3 * 8 * 8),
    }
    out: dict[str, np.ndarray] = {}
    initialised = False
    for case, (data, size) in cases.items():
        matrix = projection_matrix(size, case)
        served["detector"] = pickle.dumps(Projection(matrix))
        results = {}
        for source in [data] + ([archive] if case == "rgb12x10" else []):
            dest = os.path.join(work, f"{case}-{len(results)}.npz")
            if initialised:  # the ref command initialises the group itself, once per process
                fid.dist.init = lambda: None
            fid.ref.callback(dataset_path=source, dest_path=dest, batch=BATCH)
            initialised = True
            with np.load(dest) as saved:
                results[source] = {k: saved[k] for k in saved.files}
        first = results[data]
        assert set(first) == {"mu", "sigma"}, first.keys()
        assert first["mu"].dtype == first["sigma"].dtype == np.float64
        assert first["mu"].shape == (FEATURES,) and first["sigma"].shape == (FEATURES, FEATURES)
        cols = np.asarray(COLUMNS)
        rest = np.ones(FEATURES, bool)
        rest[cols] = False
        # the other columns' features are exactly 0, so their statistics are too: store the block
        assert (
            not first["mu"][rest].any()
            and not first["sigma"][rest].any()
            and not first["sigma"][:, rest].any()
        )
        out[f"{case}/mu"], out[f"{case}/sigma"] = first["mu"][cols], first["sigma"][np.ix_(cols, cols)]
        out[f"{case}/projection"] = matrix
        if case == "rgb12x10":
            same = all(np.array_equal(first[k], results[archive][k]) for k in first)
            out[f"{case}/zip_matches_folder"] = np.bool_(same)
            assert same
        print(case, out[f"{case}/mu"][:3], np.diag(out[f"{case}/sigma"])[:3])
    out["columns"] = np.asarray(COLUMNS, np.int64)
    np.savez(os.path.join(HERE, "fid_reference.npz"), **out)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
