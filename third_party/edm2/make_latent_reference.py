"""Reference numbers for EDM2's ImageNet-512 data path, made by NVlabs/edm2's own code.

    git --git-dir=<edm2 mirror> archive HEAD | tar -x -C /tmp/edm2
    /work/venv-torch/bin/python third_party/edm2/make_latent_reference.py --edm2=/tmp/edm2

``--edm2`` is an unmodified checkout of NVlabs/edm2 (commit 4bf8162f601bcc09472ce8a32dd0cbe8889dc8fc
was used). Writes two files beside this script:

- ``encoder_defaults.json``: the keyword defaults of ``training/encoders.py``
  ``StabilityVAEEncoder.__init__`` (``vae_name``, ``raw_mean``, ``raw_std``, ``final_mean``,
  ``final_std``, ``batch_size``), read with ``inspect`` from the imported class
  (its own ``__init__``, under ``persistent_class``'s wrapper);
- ``transform_reference.npz``: ``dataset_tool.py``'s ``make_transform`` (the ``convert``
  command's ``--transform`` / ``--resolution`` crop and resize, PIL LANCZOS / BOX / BICUBIC) applied
  to small generated uint8 RGB images: ``input/<i>`` the images (sizes chosen so every branch
  runs: odd and even sides, portrait and landscape, the ADM BOX-halving loop taken 0, 1 and 2
  times) and ``<mode>/<WxH>/<i>`` the reference's output (an absent key: the reference returned
  None, i.e. ``convert`` skips that image). ``<mode>`` is ``scale`` (no ``--transform``),
  ``center-crop``, ``center-crop-wide`` or ``center-crop-dhariwal``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [(37, 53), (64, 48), (100, 75), (33, 33), (150, 97), (20, 31)]  # (height, width)
RESOLUTIONS = [(16, 16), (32, 32), (24, 16)]  # (width, height), as --resolution=WxH
MODES = ["scale", "center-crop", "center-crop-wide", "center-crop-dhariwal"]


def images() -> list[np.ndarray]:
    """Smooth gradients plus noise (so resampling filters have structure to act on), seed 0."""
    rng = np.random.default_rng(0)
    out = []
    for h, w in SIZES:
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack(
            [255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1), 128 + 100 * np.sin(x * y / 37)], -1
        )
        noisy = base + rng.normal(0, 24, base.shape)
        out.append(np.clip(np.round(noisy), 0, 255).astype(np.uint8))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edm2", default="/work/ref/edm2")
    args = parser.parse_args()
    sys.path.insert(0, args.edm2)
    os.chdir(args.edm2)
    import dataset_tool
    from training.encoders import StabilityVAEEncoder

    # persistent_class wraps __init__ in a subclass taking *args, **kwargs: the first __init__ in
    # the MRO that names raw_mean is the reference's own.
    init = next(
        c.__init__
        for c in StabilityVAEEncoder.__mro__
        if "raw_mean" in inspect.signature(c.__init__).parameters
    )
    defaults = {k: p.default for k, p in inspect.signature(init).parameters.items() if k != "self"}
    with open(os.path.join(HERE, "encoder_defaults.json"), "w") as f:
        json.dump({"StabilityVAEEncoder": defaults}, f, indent=1)

    arrays = {}
    inputs = images()
    for i, img in enumerate(inputs):
        arrays[f"input/{i}"] = img
    for mode in MODES:
        for width, height in RESOLUTIONS:
            if mode == "center-crop-dhariwal" and width != height:
                continue
            fn = dataset_tool.make_transform(None if mode == "scale" else mode, width, height)
            for i, img in enumerate(inputs):
                out = fn(img.copy())
                if out is not None:
                    arrays[f"{mode}/{width}x{height}/{i}"] = np.asarray(out)
    np.savez_compressed(os.path.join(HERE, "transform_reference.npz"), **arrays)
    print(f"wrote encoder_defaults.json and transform_reference.npz ({len(arrays)} arrays)")


if __name__ == "__main__":
    main()
