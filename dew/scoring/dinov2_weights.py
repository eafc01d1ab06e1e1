"""Convert the official DINOv2 ViT-L/14 weights once to a non-pickle ``.npz``, and load them.

The FD_DINOv2 network is facebookresearch/dinov2's ``dinov2_vitl14`` with its LVD-142M weights,
the file ``dinov2_vitl14_pretrain.pth`` (a PyTorch ``state_dict``) that the dinov2 repository's
hub entry downloads (``dinov2/hub/backbones.py``: ``<_DINOV2_BASE_URL>/dinov2_vitl14/
dinov2_vitl14_pretrain.pth``, ``torch.hub.load_state_dict_from_url`` without ``check_hash``).
dew never downloads it and never unpickles at run time. Once, with PyTorch installed
(``torch.load(weights_only=True)``, no arbitrary code):

    python -m dew.scoring.dinov2_weights --input=dinov2_vitl14_pretrain.pth --allow_unpinned \
        [--output=~/.cache/dew/dinov2_vitl14_pretrain.npz]

**Digest.** Neither facebookresearch/dinov2 nor NVlabs/edm2 publishes a SHA-256 for this file
(the file name carries no hash prefix and the hub call does not check one), so ``PINNED_SHA256``
is empty: dew cannot vouch for a file by itself. The converter refuses a file whose digest is
not pinned unless ``--allow_unpinned`` is given; it records the file's SHA-256 in the output
(``__source_sha256__``) with every array's digest (``__content_sha256__``), and ``load_weights``
refuses weights from an unpinned source unless ``allow_unpinned=True`` (for the registered
metric: ``$DEW_DINOV2_ALLOW_UNPINNED=1``). When a digest is published, add it to
``PINNED_SHA256``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from dew import pinned_weights
from dew.pinned_weights import content_sha256 as content_sha256
from dew.pinned_weights import file_sha256 as file_sha256

SOURCE_NAME = "dinov2_vitl14_pretrain.pth"
#: SHA-256 digests of ``SOURCE_NAME`` vouched for by a publisher: none is published (see above).
PINNED_SHA256: frozenset[str] = frozenset()
DEFAULT_PATH = os.path.join("~", ".cache", "dew", "dinov2_vitl14_pretrain.npz")
ENV_VAR = "DEW_DINOV2_WEIGHTS"
ALLOW_UNPINNED_ENV = "DEW_DINOV2_ALLOW_UNPINNED"

HOW_TO_GET = (
    f"download {SOURCE_NAME} (the dinov2_vitl14 LVD-142M backbone that the GitHub repository "
    f"facebookresearch/dinov2's hub entry dinov2_vitl14 loads; no SHA-256 is published for it), "
    f"then convert it once (needs PyTorch): python -m dew.scoring.dinov2_weights "
    f"--input={SOURCE_NAME} --allow_unpinned (writes {DEFAULT_PATH}; or set {ENV_VAR} to where "
    f"you put the .npz)"
)


def default_path() -> str:
    return pinned_weights.default_path(ENV_VAR, DEFAULT_PATH)


def convert(state_dict: Mapping[str, np.ndarray], output: str, source_sha256: str, config=None) -> str:
    """Write the ViT's arrays (float32, PyTorch names; ``mask_token`` dropped) with their
    digests after checking every array is present and shaped as ``config`` (ViT-L/14 by
    default); returns the content digest."""
    from dew.scoring.dinov2 import VIT_L14, params_from_torch_names

    arrays = {k: np.asarray(v, np.float32) for k, v in state_dict.items() if k != "mask_token"}
    params_from_torch_names(arrays, config or VIT_L14)
    return pinned_weights.write_npz(output, arrays, source_sha256)


def read_arrays(path: str | None = None, *, allow_unpinned: bool = False) -> dict[str, np.ndarray]:
    """The checked arrays (PyTorch names) of a converted ``.npz``.

    ``FileNotFoundError`` (one line: the file, the source digest situation and how to get it)
    when missing; ``ValueError`` when the arrays do not match their stored digest, or when the
    source file's digest is not pinned and ``allow_unpinned`` is false."""
    path = pinned_weights.existing_file(path, default_path, "DINOv2 ViT-L/14 weights", HOW_TO_GET)
    arrays, source = pinned_weights.read_npz(path, "DINOv2 weights")
    if source not in PINNED_SHA256 and not allow_unpinned:
        pinned = ", ".join(sorted(PINNED_SHA256)) or "none is published"
        raise ValueError(
            f"DINOv2 weights {path} were converted from a file with SHA-256 {source}, which is not "
            f"pinned (pinned: {pinned}); pass allow_unpinned=True (or set {ALLOW_UNPINNED_ENV}=1) "
            "to use them anyway"
        )
    return arrays


def load_weights(path: str | None = None, *, allow_unpinned: bool = False, config=None):
    """Haiku params of ``dew.scoring.dinov2.DinoViT`` (ViT-L/14 unless ``config``) from a
    converted ``.npz`` (default ``$DEW_DINOV2_WEIGHTS`` or ``~/.cache/dew/dinov2_vitl14_pretrain.npz``);
    the checks of ``read_arrays``."""
    from dew.scoring.dinov2 import VIT_L14, params_from_torch_names

    return params_from_torch_names(read_arrays(path, allow_unpinned=allow_unpinned), config or VIT_L14)


def main(argv: Sequence[str] | None = None) -> int:
    return pinned_weights.run_unpinned_converter(
        "python -m dew.scoring.dinov2_weights",
        __doc__,
        SOURCE_NAME,
        DEFAULT_PATH,
        argv,
        default_path,
        HOW_TO_GET,
        pinned=PINNED_SHA256,
        convert=convert,
        network="DINOv2 ViT-L/14",
    )


if __name__ == "__main__":
    sys.exit(main())
