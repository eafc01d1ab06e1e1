"""Goldens for dew's augmentation pipeline (``dew.augment``), made by NVlabs/edm's own
``training/augment.py`` ``AugmentPipe`` (run with PyTorch, CPU):

    /work/venv-torch/bin/python third_party/edm/make_augment_reference.py [--edm=/path/to/edm]

Without ``--edm`` the reference checkout at /work/ref/edm is copied to a temporary directory and
imported from there. For each case (settings, input shape) the script draws seeded images
uniform in [-1, 1], calls the reference's ``AugmentPipe(**settings)(images)`` with ``torch.rand``,
``torch.randn`` and ``torch.randint`` wrapped so every random tensor it draws is recorded in
order, and writes ``augment_reference.npz`` beside this script:

* ``cases_json``: a JSON list of ``{"name", "settings", "shape"}`` (shape N, C, H, W);
* ``<name>/images`` float32 [N, C, H, W] (the input), ``<name>/out`` float32 [N, C, H, W] and
  ``<name>/labels`` float32 [N, label_dim] (the reference's return values);
* ``<name>/draw<k>``: the k-th random tensor the reference drew, squeezed of its trailing unit
  dimensions (float32 for rand/randn, int64 for randint), and ``<name>/draw_kinds`` the calls'
  names in order (``rand``, ``randn``, ``randint:<high>``).

Read with ``np.load(..., allow_pickle=False)``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PAPER = {"xflip": 1e8, "yflip": 1, "scale": 1, "rotate_frac": 1, "aniso": 1, "translate_frac": 1}
ALONE = (
    "xflip",
    "yflip",
    "rotate_int",
    "translate_int",
    "scale",
    "rotate_frac",
    "aniso",
    "translate_frac",
    "brightness",
    "contrast",
    "lumaflip",
    "hue",
    "saturation",
)
CASES: list[tuple[str, dict, tuple[int, int, int, int]]] = [
    *[(f"{name}_alone", {"p": 1, name: 1}, (4, 3, 16, 16)) for name in ALONE],
    # Larger ranges than the defaults, so the margin reaches its clamp and translations wrap.
    (
        "geometric_wide",
        {
            "p": 1,
            "scale": 1,
            "rotate_frac": 1,
            "aniso": 1,
            "translate_frac": 1,
            "scale_std": 0.6,
            "aniso_std": 0.6,
            "translate_frac_std": 0.4,
        },
        (4, 3, 16, 16),
    ),
    ("translate_int_wide", {"p": 1, "translate_int": 1, "translate_int_max": 0.9}, (4, 3, 16, 16)),
    ("geometric_nonsquare", {"p": 1, **{k: v for k, v in PAPER.items()}}, (4, 3, 12, 20)),
    (
        "colour_gray",
        {"p": 1, "brightness": 1, "contrast": 1, "lumaflip": 1, "hue": 1, "saturation": 1},
        (4, 1, 16, 16),
    ),
    (
        "colour_all",
        {"p": 1, "brightness": 1, "contrast": 1, "lumaflip": 1, "hue": 1, "saturation": 1},
        (4, 3, 16, 16),
    ),
    ("paper_p1_16", {"p": 1, **PAPER}, (4, 3, 16, 16)),
    ("paper_p1_32", {"p": 1, **PAPER}, (4, 3, 32, 32)),
    ("paper_p012_32", {"p": 0.12, **PAPER}, (8, 3, 32, 32)),
]


class Recorder:
    """Wraps torch.rand / randn / randint and keeps what each call returned, in order."""

    def __init__(self, torch):
        self.torch, self.draws, self.kinds = torch, [], []
        self.saved = {name: getattr(torch, name) for name in ("rand", "randn", "randint")}

    def __enter__(self):
        torch = self.torch

        def wrap(name):
            original = self.saved[name]

            def call(*args, **kwargs):
                out = original(*args, **kwargs)
                self.kinds.append(f"randint:{args[0]}" if name == "randint" else name)
                self.draws.append(out.detach().cpu().numpy())
                return out

            return call

        for name in self.saved:
            setattr(torch, name, wrap(name))
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.torch, name, fn)


def squeeze_trailing(x: np.ndarray) -> np.ndarray:
    while x.ndim > 1 and x.shape[-1] == 1:
        x = x[..., 0]
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--edm", default=None, help="an NVlabs/edm checkout (default: a copy of /work/ref/edm)"
    )
    parser.add_argument("--out", default=os.path.join(HERE, "augment_reference.npz"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        edm = args.edm
        if edm is None:
            edm = os.path.join(tmp, "edm")
            shutil.copytree("/work/ref/edm", edm, ignore=shutil.ignore_patterns(".git"))
        sys.path.insert(0, edm)
        import torch

        torch.set_num_threads(2)
        from training.augment import AugmentPipe

        arrays: dict[str, np.ndarray] = {}
        cases = []
        for index, (name, settings, shape) in enumerate(CASES):
            torch.manual_seed(1000 + index)
            images = torch.rand(shape, dtype=torch.float32) * 2 - 1
            pipe = AugmentPipe(**settings)
            with Recorder(torch) as rec:
                out, labels = pipe(images)
            arrays[f"{name}/images"] = images.numpy()
            arrays[f"{name}/out"] = out.numpy().astype(np.float32)
            arrays[f"{name}/labels"] = labels.numpy().astype(np.float32)
            arrays[f"{name}/draw_kinds"] = np.asarray(rec.kinds)
            for k, d in enumerate(rec.draws):
                arrays[f"{name}/draw{k}"] = squeeze_trailing(d)
            cases.append({"name": name, "settings": settings, "shape": list(shape)})
            print(f"{name}: {shape} -> labels {tuple(labels.shape)}, {len(rec.draws)} draws")
        arrays["cases_json"] = np.asarray(json.dumps(cases))
        arrays["torch_version"] = np.asarray(torch.__version__)
        np.savez_compressed(args.out, **arrays)
        print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
