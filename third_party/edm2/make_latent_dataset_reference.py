"""An EDM2-encoded latent data set written and read back by NVlabs/edm2's own code.

    git --git-dir=<edm2 mirror> archive HEAD | tar -x -C /tmp/edm2
    /work/venv-torch/bin/python third_party/edm2/make_latent_dataset_reference.py --edm2=/tmp/edm2

``--edm2`` is an unmodified checkout of NVlabs/edm2 (commit 4bf8162f601bcc09472ce8a32dd0cbe8889dc8fc
was used). Writes two files beside this script:

- ``latent_dataset_reference.zip``: what ``dataset_tool.py encode --dest=<name>.zip`` writes, made
  with its own writer (``open_dest``) and its own per-image steps (``np.save`` of the float32
  [8, h, w] mean ‖ std to ``<5 digits>/img-mean-std-<8 digits>.npy``, then ``dataset.json`` with
  ``[name, class]`` pairs). ``encode`` itself needs the real VAE on CUDA, so the arrays are
  made up (seeded normal draws, 4×4 latents); the indices span three folder prefixes (``00000/``,
  ``00099/``, ``00100/``) and are written out of sorted order, so a reader that takes the zip's order or
  one folder only fails.
- ``latent_dataset_reference.npz``: what edm2's own reader returns for that zip
  (``training/dataset.py`` ``ImageFolderDataset``): ``names`` (its sorted file list),
  ``images`` [N, 8, h, w] (``_load_raw_image`` of each index, float32) and ``labels`` [N]
  (``_load_raw_labels``, int64).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
#: Image indices as encode numbers them: three folder prefixes, written in this (unsorted) order.
INDICES = [100001, 3, 0, 99999, 100000, 12]
SHAPE = (8, 4, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edm2", required=True, help="an NVlabs/edm2 checkout")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.edm2))
    import dataset_tool
    from training.dataset import ImageFolderDataset

    zip_path = os.path.join(HERE, "latent_dataset_reference.zip")
    if os.path.exists(zip_path):
        os.remove(zip_path)
    rng = np.random.default_rng(34)
    archive_root_dir, save_bytes, close_dest = dataset_tool.open_dest(zip_path)
    labels = []
    for idx in INDICES:  # the body of dataset_tool.py's encode loop, a made-up mean_std per image
        mean_std = rng.standard_normal(SHAPE).astype(np.float32)
        mean_std[4:] = np.abs(mean_std[4:])  # the std half is positive, as the VAE's is
        idx_str = f"{idx:08d}"
        archive_fname = f"{idx_str[:5]}/img-mean-std-{idx_str}.npy"
        f = io.BytesIO()
        np.save(f, mean_std)
        save_bytes(os.path.join(archive_root_dir, archive_fname), f.getvalue())
        labels.append([archive_fname, int(rng.integers(0, 5))])
    metadata = {"labels": labels if all(x is not None for x in labels) else None}
    save_bytes(os.path.join(archive_root_dir, "dataset.json"), json.dumps(metadata))
    close_dest()

    dataset = ImageFolderDataset(zip_path)
    images = np.stack([dataset._load_raw_image(i) for i in range(len(dataset._image_fnames))])
    raw_labels = dataset._load_raw_labels()
    dataset.close()
    assert images.dtype == np.float32 and images.shape == (len(INDICES), *SHAPE), images.shape
    np.savez(
        os.path.join(HERE, "latent_dataset_reference.npz"),
        names=np.array(dataset._image_fnames),
        images=images,
        labels=raw_labels,
    )
    print(f"wrote {zip_path} ({os.path.getsize(zip_path)} bytes) and latent_dataset_reference.npz")


if __name__ == "__main__":
    main()
