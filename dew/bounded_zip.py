"""Reading a zip archive dew did not write itself (an ``.npz``, a ``.pt``) without trusting it.

A zip's central directory declares each entry's uncompressed size and CRC-32; ``zipfile`` sizes
``ZipFile.read`` by the declaration and checks the CRC only once the entry has been read to its
end. So a 4.75 MB file can declare (and inflate to) gigabytes, and a flipped byte surfaces as
``zipfile.BadZipFile`` from deep inside a reader. Here:

- ``entry_info`` refuses an entry that is encrypted, compressed by a method other than stored
  or deflate (what ``numpy.savez`` and ``torch.save`` write), or declares more than the caller's
  ``cap`` (what the entry should hold) or more than its compressed bytes can inflate to
  (``MAX_DEFLATE_RATIO``: deflate never expands past 1032:1, stored entries not at all);
- ``read_entry`` reads an entry in bounded pieces, at most ``cap`` bytes whatever the header
  says, to its end, so the CRC-32 is checked;
- every failure (a torn archive, a bad CRC, a zlib stream that stops) is one
  ``UnreadableFileError`` line naming the file, the entry and what was expected.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from typing import IO

import numpy as np

MAX_DEFLATE_RATIO = 1032
"""Deflate's largest expansion: a 258-byte match coded in 2 bits, 1032 output bytes per input byte."""
_SLACK = 1 << 10  # a deflate stream's own block headers and final bits
_PIECE = 1 << 20

#: What reading a zip archive raises for damage; ``RuntimeError``: an encrypted entry,
#: ``NotImplementedError``: an unknown compression method.
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    OSError,
    RuntimeError,
    NotImplementedError,
    ValueError,
)


class UnreadableFileError(ValueError):
    """A file dew was given is damaged, or is not what it should be: one line naming the file,
    the entry or member, and what was expected."""


def open_archive(path: str | os.PathLike, what: str, expected: str) -> zipfile.ZipFile:
    """``zipfile.ZipFile(path)``; ``UnreadableFileError`` naming ``what`` and the file (which
    was to be ``expected``) when it is not a readable zip. ``FileNotFoundError`` passes."""
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise
    except ZIP_ERRORS as e:
        raise UnreadableFileError(f"{what}: {os.fspath(path)} is not {expected} ({reason(e)})") from None


def reason(error: BaseException) -> str:
    """An exception as a short clause for an ``UnreadableFileError`` line."""
    text = str(error).splitlines()[0][:160] if str(error) else ""
    if isinstance(error, EOFError) and not text:
        return "it ends early"
    return f"{type(error).__name__}: {text}".rstrip(": ")


def entry_info(archive: zipfile.ZipFile, name: str, cap: int, where: str) -> zipfile.ZipInfo:
    """The entry ``name`` of ``archive`` once it is known to be readable within ``cap`` bytes
    (module docstring); ``where`` begins the refusal ("<flag>: <file>")."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise UnreadableFileError(f"{where}: no entry {name!r}") from None
    if info.flag_bits & 0x1:
        raise UnreadableFileError(f"{where}: entry {name!r} is encrypted; expected a plain zip entry")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise UnreadableFileError(
            f"{where}: entry {name!r} uses compression method {info.compress_type}; expected stored, deflate"
        )
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else MAX_DEFLATE_RATIO
    if info.file_size > ratio * info.compress_size + (_SLACK if ratio > 1 else 0):
        raise UnreadableFileError(
            f"{where}: entry {name!r} declares {info.file_size} bytes from {info.compress_size} compressed "
            "ones, more than they can hold (damaged)"
        )
    if info.file_size > cap:
        raise UnreadableFileError(
            f"{where}: entry {name!r} declares {info.file_size} bytes; expected at most {cap}"
        )
    return info


def read_entry(archive: zipfile.ZipFile, name: str, cap: int, where: str) -> bytes:
    """Entry ``name``'s bytes, at most ``cap`` of them, its CRC-32 checked (module docstring)."""
    info = entry_info(archive, name, cap, where)
    pieces, size = [], 0
    try:
        with archive.open(info) as f:
            while piece := f.read(min(_PIECE, cap + 1 - size)):
                size += len(piece)
                pieces.append(piece)
                if size > cap:
                    raise UnreadableFileError(f"{where}: entry {name!r} inflates past {cap} bytes")
    except UnreadableFileError:
        raise
    except ZIP_ERRORS as e:
        raise UnreadableFileError(f"{where}: entry {name!r} cannot be read ({reason(e)})") from None
    if size != info.file_size:
        raise UnreadableFileError(
            f"{where}: entry {name!r} holds {size} bytes, its header says {info.file_size}"
        )
    return b"".join(pieces)


def read_exactly(f: IO[bytes], array: np.ndarray, where: str) -> None:
    """Fill the C-contiguous ``array`` with bytes from ``f`` (an open zip entry), or refuse
    naming ``where``."""
    buffer = array.data.cast("B")
    done = 0
    try:
        while done < len(buffer):
            got = f.readinto(buffer[done : done + _PIECE])  # type: ignore[attr-defined]
            if not got:
                raise UnreadableFileError(f"{where} ends after {done} of {len(buffer)} bytes (truncated)")
            done += got
    except UnreadableFileError:
        raise
    except ZIP_ERRORS as e:
        raise UnreadableFileError(f"{where} cannot be read ({reason(e)})") from None


__all__ = [
    "MAX_DEFLATE_RATIO",
    "ZIP_ERRORS",
    "UnreadableFileError",
    "entry_info",
    "open_archive",
    "read_entry",
    "read_exactly",
    "reason",
]
