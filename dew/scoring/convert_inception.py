"""Convert the FID Inception weights once to a non-pickle ``.npz``, and load them pinned.

The standard FID network's weights are pytorch-fid's ``pt_inception-2015-12-05-6726825d.pth``
(a PyTorch ``state_dict`` of the 2015-12-05 TensorFlow FID graph; the ``fid_weights`` release of
the GitHub repository mseitzer/pytorch-fid). dew never downloads them and never unpickles at run
time. Once, with PyTorch installed (``torch.load(weights_only=True)``, no arbitrary code):

    python -m dew.scoring.convert_inception --input=pt_inception-2015-12-05-6726825d.pth \
        [--output=~/.cache/dew/inception_fid_2015-12-05.npz]

The input must have the pinned SHA-256 (``SOURCE_SHA256``; its first 8 digits are the ones in
the file name, PyTorch hub's convention). The output holds the float32 arrays under their
PyTorch names plus ``__source_sha256__`` and ``__content_sha256__`` (a digest of every name,
dtype, shape and byte); ``load_weights`` checks both before building the haiku params.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from dew.npz import open_npz

SOURCE_NAME = "pt_inception-2015-12-05-6726825d.pth"
#: SHA-256 of pytorch-fid's FID Inception weights (prefix 6726825d as in the file's name).
SOURCE_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"
DEFAULT_PATH = os.path.join("~", ".cache", "dew", "inception_fid_2015-12-05.npz")
ENV_VAR = "DEW_INCEPTION_WEIGHTS"

HOW_TO_GET = (
    f"download {SOURCE_NAME} from the 'fid_weights' release of the GitHub repository "
    f"mseitzer/pytorch-fid, then convert it once (needs PyTorch): python -m "
    f"dew.scoring.convert_inception --input={SOURCE_NAME} (writes {DEFAULT_PATH}; or set "
    f"{ENV_VAR} to where you put the .npz)"
)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    """A digest of every array's name, dtype, shape and bytes (in name order)."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def convert(state_dict: Mapping[str, np.ndarray], output: str, source_sha256: str) -> str:
    """Write the FID network's arrays (float32, PyTorch names; the classifier head and batch
    counters dropped) with their digests; returns the content digest."""
    arrays = {
        k: np.asarray(v, np.float32)
        for k, v in state_dict.items()
        if not k.startswith("fc.") and not k.endswith("num_batches_tracked")
    }
    from dew.scoring.inception import params_from_torch_names

    params_from_torch_names(arrays)  # every layer present, every shape right
    digest = content_sha256(arrays)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "wb") as f:
        np.savez(f, __source_sha256__=np.str_(source_sha256), __content_sha256__=np.str_(digest), **arrays)
    return digest


def default_path() -> str:
    return os.path.expanduser(os.environ.get(ENV_VAR) or DEFAULT_PATH)


def load_weights(path: str | None = None, *, pinned: bool = True):
    """The haiku params of the FID Inception from a converted ``.npz`` (default: ``$DEW_INCEPTION_WEIGHTS``
    or ``~/.cache/dew/inception_fid_2015-12-05.npz``).

    Raises ``FileNotFoundError`` saying where to get the weights and how to convert them when the
    file is missing, and ``ValueError`` when its arrays do not match their stored digest or (with
    ``pinned``) it was not made from the pinned source file."""
    from dew.scoring.inception import params_from_torch_names

    path = os.path.expanduser(path) if path else default_path()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"FID Inception weights not found at {path}: {HOW_TO_GET}")
    with open_npz(path, "FID Inception weights") as data:
        arrays = {k: data[k] for k in data.files if not k.startswith("__")}
        source = str(data["__source_sha256__"]) if "__source_sha256__" in data.files else None
        stored = str(data["__content_sha256__"]) if "__content_sha256__" in data.files else None
    if stored is None or content_sha256(arrays) != stored:
        raise ValueError(f"FID Inception weights {path} are damaged (content digest mismatch); convert again")
    if pinned and source != SOURCE_SHA256:
        raise ValueError(
            f"FID Inception weights {path} were converted from a file with SHA-256 {source}, not the "
            f"standard {SOURCE_NAME} ({SOURCE_SHA256}); FID from them would not be comparable"
        )
    return params_from_torch_names(arrays)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dew.scoring.convert_inception", description=__doc__)
    parser.add_argument("--input", required=True, help=f"the downloaded {SOURCE_NAME}")
    parser.add_argument("--output", default=None, help=f"where to write the .npz (default {DEFAULT_PATH})")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    output = os.path.expanduser(args.output) if args.output else default_path()
    if not os.path.isfile(args.input):
        print(f"error: --input={args.input!r} does not exist; {HOW_TO_GET}", file=sys.stderr)
        return 2
    digest = file_sha256(args.input)
    if digest != SOURCE_SHA256:
        print(
            f"error: --input={args.input!r} has SHA-256 {digest}, expected {SOURCE_SHA256} ({SOURCE_NAME})",
            file=sys.stderr,
        )
        return 2
    try:
        import torch
    except ImportError:
        print("error: converting needs PyTorch once (install torch); dew itself does not", file=sys.stderr)
        return 2
    state = torch.load(args.input, map_location="cpu", weights_only=True)
    content = convert({k: v.numpy() for k, v in state.items()}, output, digest)
    print(f"wrote {output} (content sha256 {content})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
