"""Convert the official DINOv2 ViT-B/14 weights (REPA's default encoder) once to a non-pickle
``.npz``, and load them; the pattern and checks of ``dew.scoring.dinov2_weights`` (ViT-L/14).

The file is ``dinov2_vitb14_pretrain.pth``, the LVD-142M backbone the facebookresearch/dinov2
hub entry ``dinov2_vitb14`` downloads (``torch.hub.load_state_dict_from_url`` without
``check_hash``), which REPA's ``load_encoders`` loads for ``--enc-type=dinov2-vit-b``. dew never
downloads it and never unpickles at run time. Once, with PyTorch installed:

    python -m dew.scoring.dinov2_vitb14_weights --input=dinov2_vitb14_pretrain.pth --allow_unpinned \
        [--output=~/.cache/dew/dinov2_vitb14_pretrain.npz]

**Digest.** No SHA-256 is published for this file, so ``PINNED_SHA256`` is empty: the converter
refuses it unless ``--allow_unpinned``, records its SHA-256 and every array's digest in the
output, and ``load_weights`` refuses weights from an unpinned source unless
``allow_unpinned=True`` (for REPA: ``config.objective.repa.allow_unpinned``). When a digest is
published, add it to ``PINNED_SHA256``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from dew import pinned_weights
from dew.scoring import dinov2_weights

SOURCE_NAME = "dinov2_vitb14_pretrain.pth"
#: SHA-256 digests of ``SOURCE_NAME`` vouched for by a publisher: none is published (see above).
PINNED_SHA256: frozenset[str] = frozenset()
DEFAULT_PATH = os.path.join("~", ".cache", "dew", "dinov2_vitb14_pretrain.npz")
ENV_VAR = "DEW_DINOV2_VITB14_WEIGHTS"

HOW_TO_GET = (
    f"download {SOURCE_NAME} (the dinov2_vitb14 LVD-142M backbone that the GitHub repository "
    f"facebookresearch/dinov2's hub entry dinov2_vitb14 loads; no SHA-256 is published for it), "
    f"then convert it once (needs PyTorch): python -m dew.scoring.dinov2_vitb14_weights "
    f"--input={SOURCE_NAME} --allow_unpinned (writes {DEFAULT_PATH}; or set {ENV_VAR} to where "
    f"you put the .npz)"
)


def default_path() -> str:
    return pinned_weights.default_path(ENV_VAR, DEFAULT_PATH)


def convert(state_dict: Mapping[str, np.ndarray], output: str, source_sha256: str) -> str:
    """Write the ViT-B/14's arrays (float32, PyTorch names; ``mask_token`` dropped) with their
    digests after checking every array is present and shaped (``dinov2_weights.convert`` for
    ``VIT_B14``); returns the content digest."""
    from dew.scoring.dinov2 import VIT_B14

    return dinov2_weights.convert(state_dict, output, source_sha256, config=VIT_B14)


def read_arrays(path: str | None = None, *, allow_unpinned: bool = False) -> dict[str, np.ndarray]:
    """The checked arrays (PyTorch names) of a converted ``.npz``; the refusals of
    ``dew.scoring.dinov2_weights.read_arrays``."""
    path = pinned_weights.existing_file(path, default_path, "DINOv2 ViT-B/14 weights", HOW_TO_GET)
    arrays, source = pinned_weights.read_npz(path, "DINOv2 ViT-B/14 weights")
    if source not in PINNED_SHA256 and not allow_unpinned:
        raise ValueError(
            f"DINOv2 ViT-B/14 weights {path} were converted from a file with SHA-256 {source}, which is "
            "not pinned (pinned: none is published); pass allow_unpinned=True "
            "(config.objective.repa.allow_unpinned=True) to use them anyway"
        )
    return arrays


def load_weights(path: str | None = None, *, allow_unpinned: bool = False, config=None):
    """Haiku params of ``dew.scoring.dinov2.DinoViT(VIT_B14)`` from a converted ``.npz``
    (default ``$DEW_DINOV2_VITB14_WEIGHTS`` or ``~/.cache/dew/dinov2_vitb14_pretrain.npz``)."""
    from dew.scoring.dinov2 import VIT_B14, params_from_torch_names

    return params_from_torch_names(read_arrays(path, allow_unpinned=allow_unpinned), config or VIT_B14)


def main(argv: Sequence[str] | None = None) -> int:
    return pinned_weights.run_unpinned_converter(
        "python -m dew.scoring.dinov2_vitb14_weights",
        __doc__,
        SOURCE_NAME,
        DEFAULT_PATH,
        argv,
        default_path,
        HOW_TO_GET,
        pinned=PINNED_SHA256,
        convert=convert,
        network="DINOv2 ViT-B/14",
    )


if __name__ == "__main__":
    sys.exit(main())
