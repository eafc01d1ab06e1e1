"""Convert the FID Inception weights once to a non-pickle ``.npz``, and load them pinned.

The standard FID network's weights are pytorch-fid's ``pt_inception-2015-12-05-6726825d.pth``
(a PyTorch ``state_dict`` of the 2015-12-05 TensorFlow FID graph; the ``fid_weights`` release of
the GitHub repository mseitzer/pytorch-fid). dew never downloads them and never unpickles at run
time. Once, with PyTorch installed (``torch.load(weights_only=True)``, no arbitrary code):

    python -m dew.scoring.convert_inception --input=pt_inception-2015-12-05-6726825d.pth \
        [--output=~/.cache/dew/inception_fid_2015-12-05.npz]

The input must have the pinned SHA-256 (``SOURCE_SHA256``; its first 8 digits are the ones in
the file name, PyTorch hub's convention). The output holds the float32 arrays under their
PyTorch names (the classifier's ``fc.weight`` included: ADM's Inception Score reads it) plus
``__source_sha256__`` and ``__content_sha256__`` (a digest of every name,
dtype, shape and byte); ``load_weights`` checks both before building the haiku params.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from dew import pinned_weights
from dew.npz import NotAnNpzError
from dew.pinned_weights import content_sha256 as content_sha256
from dew.pinned_weights import file_sha256 as file_sha256

SOURCE_NAME = "pt_inception-2015-12-05-6726825d.pth"
#: SHA-256 of pytorch-fid's FID Inception weights (prefix 6726825d as in the file's name).
SOURCE_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"
DEFAULT_PATH = os.path.join("~", ".cache", "dew", "inception_fid_2015-12-05.npz")
ENV_VAR = "DEW_INCEPTION_WEIGHTS"

CONVERT = "convert them with python -m dew.scoring.convert_inception"  # said of a file not an .npz
HOW_TO_GET = (
    f"download {SOURCE_NAME} from the 'fid_weights' release of the GitHub repository "
    f"mseitzer/pytorch-fid, then convert it once (needs PyTorch): python -m "
    f"dew.scoring.convert_inception --input={SOURCE_NAME} (writes {DEFAULT_PATH}; or set "
    f"{ENV_VAR} to where you put the .npz)"
)


def convert(state_dict: Mapping[str, np.ndarray], output: str, source_sha256: str) -> str:
    """Write the FID network's arrays (float32, PyTorch names; the batch counters and the
    classifier's bias dropped, its weight ``fc.weight`` kept for ADM's Inception Score) with
    their digests; returns the content digest."""
    arrays = {
        k: np.asarray(v, np.float32)
        for k, v in state_dict.items()
        if k != "fc.bias" and not k.endswith("num_batches_tracked")
    }
    from dew.scoring.inception import params_from_torch_names

    params_from_torch_names(arrays)  # every layer present, every shape right
    return pinned_weights.write_npz(output, arrays, source_sha256)


def default_path() -> str:
    return pinned_weights.default_path(ENV_VAR, DEFAULT_PATH)


def weights_file(path: str | None = None) -> str:
    """``path`` (default ``default_path()``; ``~`` expanded) when the file exists, else
    ``FileNotFoundError`` in one line naming it and saying how to get and convert the weights."""
    return pinned_weights.existing_file(path, default_path, "FID Inception weights", HOW_TO_GET)


def read_checked(path: str | None = None, *, pinned: bool = True, scores: str = "FID") -> tuple[str, dict]:
    """(the file, its arrays by PyTorch name) of the converted ``.npz`` at ``path`` (default
    ``default_path()``), read once and checked as ``load_weights`` says; ``scores`` names what
    would not be comparable in the refusal of an unpinned file. A file that is not an ``.npz``
    is ``NotAnNpzError`` saying to convert the weights."""
    path = weights_file(path)
    try:
        arrays, source = pinned_weights.read_npz(path, "FID Inception weights")
    except NotAnNpzError as e:  # e.g. the downloaded .pth itself
        raise NotAnNpzError(f"{e}; {CONVERT}") from None
    if pinned and source != SOURCE_SHA256:
        raise ValueError(
            f"FID Inception weights {path} were converted from a file with SHA-256 {source}, not the "
            f"standard {SOURCE_NAME} ({SOURCE_SHA256}); {scores} from them would not be comparable"
        )
    return path, arrays


def load_weights(path: str | None = None, *, pinned: bool = True):
    """The haiku params of the FID Inception from a converted ``.npz`` (default: ``$DEW_INCEPTION_WEIGHTS``
    or ``~/.cache/dew/inception_fid_2015-12-05.npz``).

    Raises ``FileNotFoundError`` saying where to get the weights and how to convert them when the
    file is missing, and ``ValueError`` when its arrays do not match their stored digest or (with
    ``pinned``) it was not made from the pinned source file."""
    from dew.scoring.inception import params_from_torch_names

    return params_from_torch_names(read_checked(path, pinned=pinned)[1])


def load_classifier(path: str | None = None, *, pinned: bool = True) -> np.ndarray:
    """The graph's classifier weight ``fc.weight`` [1008, 2048] (``softmax/weights`` transposed)
    from the converted ``.npz``, checked as ``load_weights`` checks it; ``ValueError`` saying to
    convert again when the file was converted without it (by a dew from before ADM's metrics)."""
    return classifier(*read_checked(path, pinned=pinned, scores="scores"))


def classifier(path: str, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """``fc.weight`` of the arrays ``read_checked`` read from ``path``, as ``load_classifier``."""
    from dew.scoring.inception import CLASSES, FEATURE_DIM

    weight = arrays.get("fc.weight")
    if weight is None or weight.shape != (CLASSES, FEATURE_DIM):
        raise ValueError(
            f"FID Inception weights {path} hold no classifier fc.weight [{CLASSES}, {FEATURE_DIM}] (the "
            f"Inception Score needs it): convert {SOURCE_NAME} again with python -m "
            "dew.scoring.convert_inception"
        )
    return weight


def _refuse(digest: str, args) -> str | None:
    return None if digest == SOURCE_SHA256 else f"expected {SOURCE_SHA256} ({SOURCE_NAME})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = pinned_weights.converter_parser(
        "python -m dew.scoring.convert_inception", __doc__, SOURCE_NAME, DEFAULT_PATH
    )
    return pinned_weights.run_converter(
        parser, argv, default_path, HOW_TO_GET, refuse=_refuse, convert=convert
    )


if __name__ == "__main__":
    sys.exit(main())
