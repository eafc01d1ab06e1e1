"""Opening an ``.npz`` archive a person named on the command line, with one clear error.

``numpy.load`` on a file that is not an ``.npz`` (a text file, a ``.npy``, a torch file, a
truncated download) falls through to pickle and fails with numpy's pickle message, naming no
file; ``open_npz`` names the flag, the file and what was expected instead. Never unpickles.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np


class NotAnNpzError(ValueError):
    """The file is not a readable ``.npz`` archive; the message names the flag and the file."""


def open_npz(path: str | os.PathLike, what: str) -> np.lib.npyio.NpzFile:
    """``np.load(path, allow_pickle=False)`` when ``path`` is an ``.npz`` archive, for use in a
    ``with`` block; ``NotAnNpzError`` naming ``what`` (e.g. ``"--state_dict"``) and the file when
    it is not (``FileNotFoundError`` passes through for a file that does not exist)."""
    expected = "an .npz archive (a zip of .npy arrays, as numpy.savez writes)"
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise NotAnNpzError(f"{what}: {os.fspath(path)} is not {expected} ({_reason(e)})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise NotAnNpzError(f"{what}: {os.fspath(path)} holds a single .npy array, not {expected}")
    return loaded


def _reason(error: BaseException) -> str:
    if isinstance(error, ValueError) and "pickle" in str(error):  # numpy fell through to pickle
        return "it is neither a zip archive nor a .npy array"
    if isinstance(error, EOFError):
        return "it is empty"
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")
