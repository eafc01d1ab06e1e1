"""NVlabs/edm's data set format, written and read by NVlabs/edm's own code, for dew's
``image_folder`` source test (run with PyTorch; it imports the reference's ``training/dataset.py``).

    /work/venv-torch/bin/python third_party/edm/make_dataset_reference.py --edm=/tmp/edm_ref

1. Generates source PNGs (seeded noise, so every image and its mirror differ): 10 RGB 8x8 images
   in three class folders ``class_a/``, ``class_b/``, ``class_c/`` (4, 3, 3 images), and 6
   greyscale 8x8 images in one flat folder.
2. Runs the reference's ``dataset_tool.py --source=<folder> --dest=<zip>`` on each, which writes
   ``dataset_rgb_labels.zip`` (labels from the top-level folder names: 0, 1, 2) and
   ``dataset_gray_unlabelled.zip`` (``"labels": null``) into this directory.
3. Reads them back with the reference's ``ImageFolderDataset`` and writes
   ``dataset_reference.npz``:

   * ``rgb_images`` uint8 [20, 3, 8, 8], ``rgb_labels`` float32 [20, 3] (one-hot),
     ``rgb_raw_idx`` int64, ``rgb_xflip`` uint8: ``dataset[i]`` and ``get_details(i)`` for every
     row of ``ImageFolderDataset(zip, use_labels=True, xflip=True, cache=True)``;
   * ``rgb_float`` float32: ``rgb_images`` as ``training_loop.py`` feeds them to the network,
     ``images.to(torch.float32) / 127.5 - 1``;
   * ``subset_*`` (same fields): ``max_size=6, random_seed=3, xflip=True, use_labels=True``;
   * ``unlabelled_label_dim``: ``label_dim`` with ``use_labels=False`` (0);
   * ``gray_images`` uint8 [6, 1, 8, 8] (no xflip), ``gray_has_labels`` (False with
     ``use_labels=True``: ``train.py --cond=1`` refuses such a set);
   * ``folder_matches_zip``: the same reads on the zip extracted to a folder gave equal arrays.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CLASS_SIZES = {"class_a": 4, "class_b": 3, "class_c": 3}
GRAY_COUNT = 6
RESOLUTION = 8


def write_sources(root: str) -> tuple[str, str]:
    import PIL.Image

    rng = np.random.default_rng(31)
    rgb = os.path.join(root, "rgb")
    for folder, count in CLASS_SIZES.items():
        os.makedirs(os.path.join(rgb, folder))
        for i in range(count):
            pixels = rng.integers(0, 256, (RESOLUTION, RESOLUTION, 3), dtype=np.uint8)
            PIL.Image.fromarray(pixels, "RGB").save(os.path.join(rgb, folder, f"{i:02d}.png"))
    gray = os.path.join(root, "gray")
    os.makedirs(gray)
    for i in range(GRAY_COUNT):
        pixels = rng.integers(0, 256, (RESOLUTION, RESOLUTION), dtype=np.uint8)
        PIL.Image.fromarray(pixels, "L").save(os.path.join(gray, f"{i:02d}.png"))
    return rgb, gray


def run_dataset_tool(edm: str, source: str, dest: str) -> None:
    if os.path.exists(dest):
        os.remove(dest)
    subprocess.run(
        [sys.executable, os.path.join(edm, "dataset_tool.py"), f"--source={source}", f"--dest={dest}"],
        cwd=edm,
        check=True,
    )


def read_all(dataset) -> dict[str, np.ndarray]:
    import torch

    rows = [dataset[i] for i in range(len(dataset))]
    details = [dataset.get_details(i) for i in range(len(dataset))]
    images = np.stack([image for image, _ in rows])
    return {
        "images": images,
        "labels": np.stack([label for _, label in rows]).astype(np.float32),
        "raw_idx": np.array([d.raw_idx for d in details], np.int64),
        "xflip": np.array([d.xflip for d in details], np.uint8),
        "float": (torch.as_tensor(images).to(torch.float32) / 127.5 - 1).numpy(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edm", required=True, help="an unmodified NVlabs/edm checkout")
    args = parser.parse_args()
    edm = os.path.abspath(args.edm)
    sys.path.insert(0, edm)
    import torch

    torch.set_num_threads(1)
    from training.dataset import ImageFolderDataset

    rgb_zip = os.path.join(HERE, "dataset_rgb_labels.zip")
    gray_zip = os.path.join(HERE, "dataset_gray_unlabelled.zip")
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as root:
        rgb, gray = write_sources(root)
        run_dataset_tool(edm, rgb, rgb_zip)
        run_dataset_tool(edm, gray, gray_zip)
        settings = {
            "rgb": dict(use_labels=True, xflip=True, cache=True),
            "subset": dict(use_labels=True, xflip=True, cache=True, max_size=6, random_seed=3),
        }
        folder = os.path.join(root, "extracted")
        with zipfile.ZipFile(rgb_zip) as archive:
            archive.extractall(folder)
        matches = True
        for prefix, kwargs in settings.items():
            read = read_all(ImageFolderDataset(path=rgb_zip, **kwargs))
            again = read_all(ImageFolderDataset(path=folder, **kwargs))
            matches &= all(np.array_equal(read[k], again[k]) for k in read)
            out.update({f"{prefix}_{k}": v for k, v in read.items()})
        out["unlabelled_label_dim"] = np.int64(ImageFolderDataset(path=rgb_zip, use_labels=False).label_dim)
        gray_set = ImageFolderDataset(path=gray_zip, use_labels=True)
        out["gray_images"] = np.stack([gray_set[i][0] for i in range(len(gray_set))])
        out["gray_has_labels"] = np.bool_(gray_set.has_labels)
        out["folder_matches_zip"] = np.bool_(matches)
    assert matches, "the reference read the folder form differently from the zip"
    np.savez_compressed(os.path.join(HERE, "dataset_reference.npz"), **out)
    for key, value in out.items():
        print(f"{key}: {value.dtype} {value.shape}")


if __name__ == "__main__":
    main()
