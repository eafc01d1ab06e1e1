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

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from dew.npz import open_npz
from dew.scoring.convert_inception import content_sha256, file_sha256

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
    return os.path.expanduser(os.environ.get(ENV_VAR) or DEFAULT_PATH)


def convert(state_dict: Mapping[str, np.ndarray], output: str, source_sha256: str, config=None) -> str:
    """Write the ViT's arrays (float32, PyTorch names; ``mask_token`` dropped) with their
    digests after checking every array is present and shaped as ``config`` (ViT-L/14 by
    default); returns the content digest."""
    from dew.scoring.dinov2 import VIT_L14, params_from_torch_names

    arrays = {k: np.asarray(v, np.float32) for k, v in state_dict.items() if k != "mask_token"}
    params_from_torch_names(arrays, config or VIT_L14)
    digest = content_sha256(arrays)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "wb") as f:
        np.savez(f, __source_sha256__=np.str_(source_sha256), __content_sha256__=np.str_(digest), **arrays)
    return digest


def read_arrays(path: str | None = None, *, allow_unpinned: bool = False) -> dict[str, np.ndarray]:
    """The checked arrays (PyTorch names) of a converted ``.npz``.

    ``FileNotFoundError`` (one line: the file, the source digest situation and how to get it)
    when missing; ``ValueError`` when the arrays do not match their stored digest, or when the
    source file's digest is not pinned and ``allow_unpinned`` is false."""
    path = os.path.expanduser(path) if path else default_path()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"DINOv2 ViT-L/14 weights not found at {path}: {HOW_TO_GET}")
    with open_npz(path, "DINOv2 weights") as data:
        arrays = {k: data[k] for k in data.files if not k.startswith("__")}
        source = str(data["__source_sha256__"]) if "__source_sha256__" in data.files else None
        stored = str(data["__content_sha256__"]) if "__content_sha256__" in data.files else None
    if stored is None or content_sha256(arrays) != stored:
        raise ValueError(f"DINOv2 weights {path} are damaged (content digest mismatch); convert again")
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
    parser = argparse.ArgumentParser(prog="python -m dew.scoring.dinov2_weights", description=__doc__)
    parser.add_argument("--input", required=True, help=f"the downloaded {SOURCE_NAME}")
    parser.add_argument("--output", default=None, help=f"where to write the .npz (default {DEFAULT_PATH})")
    parser.add_argument(
        "--allow_unpinned", action="store_true", help="convert a file whose SHA-256 is not pinned"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    output = os.path.expanduser(args.output) if args.output else default_path()
    if not os.path.isfile(args.input):
        print(f"error: --input={args.input!r} does not exist; {HOW_TO_GET}", file=sys.stderr)
        return 2
    digest = file_sha256(args.input)
    if digest not in PINNED_SHA256 and not args.allow_unpinned:
        print(
            f"error: --input={args.input!r} has SHA-256 {digest}, which is not pinned (no digest of "
            f"{SOURCE_NAME} is published); pass --allow_unpinned to convert it anyway",
            file=sys.stderr,
        )
        return 2
    try:
        import torch
    except ImportError:
        print("error: converting needs PyTorch once (install torch); dew itself does not", file=sys.stderr)
        return 2
    state = torch.load(args.input, map_location="cpu", weights_only=True)
    try:
        content = convert({k: v.numpy() for k, v in state.items()}, output, digest)
    except (KeyError, ValueError) as e:
        print(f"error: --input={args.input!r} is not a DINOv2 ViT-L/14 state_dict: {e}", file=sys.stderr)
        return 2
    print(f"wrote {output} (source sha256 {digest}, content sha256 {content})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
