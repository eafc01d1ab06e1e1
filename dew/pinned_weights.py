"""Published weights kept by their digest: the pieces every pinned converter and loader shares.

A network dew scores or encodes with (the FID Inception, DINOv2, sd-vae-ft-mse) comes from a file
someone else publishes. dew never downloads it and never unpickles at run time: a converter turns
a PyTorch ``state_dict`` into an ``.npz`` once (``torch.load(weights_only=True)``), recording the
source file's SHA-256 (``__source_sha256__``) and a digest of every array (``__content_sha256__``),
and the loader checks both; a file dew reads as published (safetensors) is checked by its own
SHA-256. What is pinned, and what a refusal says, stays with each network's module; this one holds
the digests, the paths (``$ENV_VAR`` or a default under ``~/.cache/dew``), the one-line
missing-file error, the ``.npz`` layout and the converter command's common steps (with the
``--allow_unpinned`` command of a file no publisher pins a digest for).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from dew.npz import open_npz

SOURCE_KEY = "__source_sha256__"
CONTENT_KEY = "__content_sha256__"


def file_sha256(path: str) -> str:
    """The SHA-256 (hex) of the file at ``path``, read in 1 MiB chunks."""
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


def default_path(env_var: str, default: str) -> str:
    """``$env_var`` when set and not empty, else ``default``; ``~`` expanded."""
    return os.path.expanduser(os.environ.get(env_var) or default)


def existing_file(path: str | None, fallback: Callable[[], str], what: str, how_to_get: str) -> str:
    """``path`` (``~`` expanded; ``fallback()`` when not given) when it is a file, else
    ``FileNotFoundError`` in one line: ``"<what> not found at <path>: <how_to_get>"``."""
    path = os.path.expanduser(path) if path else fallback()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found at {path}: {how_to_get}")
    return path


def write_npz(output: str, arrays: Mapping[str, np.ndarray], source_sha256: str) -> str:
    """Write ``arrays`` to ``output`` (its folder made) with the source file's digest and their
    content digest; returns the content digest."""
    digest = content_sha256(arrays)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "wb") as f:
        np.savez(
            f,
            **{SOURCE_KEY: np.str_(source_sha256), CONTENT_KEY: np.str_(digest)},
            **arrays,
            allow_pickle=False,
        )
    return digest


def read_npz(path: str, what: str) -> tuple[dict[str, np.ndarray], str | None]:
    """The arrays of an ``.npz`` ``write_npz`` wrote and the source digest it records (None when
    it records none). ``ValueError`` naming ``what`` and the file when it is not an ``.npz``
    (``dew.npz.NotAnNpzError``) or its arrays do not match their stored content digest."""
    with open_npz(path, what) as data:
        arrays = {k: data[k] for k in data.files if not k.startswith("__")}
        source = str(data[SOURCE_KEY]) if SOURCE_KEY in data.files else None
        stored = str(data[CONTENT_KEY]) if CONTENT_KEY in data.files else None
    if stored is None or content_sha256(arrays) != stored:
        raise ValueError(f"{what} {path} are damaged (content digest mismatch); convert again")
    return arrays, source


def converter_parser(prog: str, description: str | None, source_name: str, default: str):
    """The converter command's parser: ``--input`` (the downloaded ``source_name``) and
    ``--output`` (default ``default``); a module adds its own flags."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--input", required=True, help=f"the downloaded {source_name}")
    parser.add_argument("--output", default=None, help=f"where to write the .npz (default {default})")
    return parser


def run_converter(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    fallback: Callable[[], str],
    how_to_get: str,
    *,
    refuse: Callable[[str, argparse.Namespace], str | None],
    convert: Callable[[dict[str, np.ndarray], str, str], str],
    network: str | None = None,
    report_source: bool = False,
) -> int:
    """The converter command: parse ``argv``; check ``--input`` exists (else say ``how_to_get``)
    and that ``refuse(digest, args)`` has no objection to its SHA-256 (its text follows
    ``"has SHA-256 <digest>, "``); read it with PyTorch (``weights_only``); ``convert(state,
    output, digest)`` to ``--output`` (``fallback()`` when not given). With ``network``, a
    ``KeyError``/``ValueError`` of ``convert`` is reported as not being that network's
    ``state_dict``. Every refusal is one ``error:`` line on stderr and exit status 2; success
    prints what was written (the source digest too with ``report_source``) and returns 0."""
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    output = os.path.expanduser(args.output) if args.output else fallback()
    if not os.path.isfile(args.input):
        return _error(f"--input={args.input!r} does not exist; {how_to_get}")
    digest = file_sha256(args.input)
    objection = refuse(digest, args)
    if objection is not None:
        return _error(f"--input={args.input!r} has SHA-256 {digest}, {objection}")
    try:
        # torch is needed once, to convert; not installed where the types are checked.
        import torch  # pyright: ignore[reportMissingImports]
    except ImportError:
        return _error("converting needs PyTorch once (install torch); dew itself does not")
    state = torch.load(args.input, map_location="cpu", weights_only=True)
    arrays = {k: v.numpy() for k, v in state.items()}
    if network is None:
        content = convert(arrays, output, digest)
    else:
        try:
            content = convert(arrays, output, digest)
        except (KeyError, ValueError) as e:
            return _error(f"--input={args.input!r} is not a {network} state_dict: {e}")
    source = f"source sha256 {digest}, " if report_source else ""
    print(f"wrote {output} ({source}content sha256 {content})")
    return 0


def run_unpinned_converter(
    prog: str,
    description: str | None,
    source_name: str,
    default: str,
    argv: Sequence[str] | None,
    fallback: Callable[[], str],
    how_to_get: str,
    *,
    pinned: Collection[str],
    convert: Callable[[dict[str, np.ndarray], str, str], str],
    network: str,
) -> int:
    """The converter command for a file whose publisher may pin no digest (``pinned`` may be
    empty): ``converter_parser``'s flags and ``--allow_unpinned``; a file whose SHA-256 is not in
    ``pinned`` is refused (``"which is not pinned (no digest of <source_name> is published); pass
    --allow_unpinned to convert it anyway"``) unless the flag is given; then ``run_converter``
    with ``network`` named and the source digest reported."""
    parser = converter_parser(prog, description, source_name, default)
    parser.add_argument(
        "--allow_unpinned", action="store_true", help="convert a file whose SHA-256 is not pinned"
    )

    def refuse(digest: str, args: argparse.Namespace) -> str | None:
        if digest in pinned or args.allow_unpinned:
            return None
        return (
            f"which is not pinned (no digest of {source_name} is published); pass --allow_unpinned to "
            "convert it anyway"
        )

    return run_converter(
        parser,
        argv,
        fallback,
        how_to_get,
        refuse=refuse,
        convert=convert,
        network=network,
        report_source=True,
    )


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


__all__ = [
    "content_sha256",
    "converter_parser",
    "default_path",
    "existing_file",
    "file_sha256",
    "read_npz",
    "run_converter",
    "run_unpinned_converter",
    "write_npz",
]
