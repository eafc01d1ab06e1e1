"""Reading ``.npz`` archives and ``.npy`` arrays dew is given, bounded and checked, with one clear
error.

``numpy.load`` trusts what a file declares: a ``.npy`` header asking for a (200000, 200000)
float64 array is allocated (298 GiB) before a byte of it is read, a flipped byte surfaces as
``zipfile.BadZipFile`` from inside a reader, a text file falls through to pickle's message. Here:

- ``read_npz(path, what, schema)`` opens the archive (``dew.bounded_zip``), refuses members the
  schema does not name (unless ``others="ignore"``) and members it requires that are missing;
  then, for each member, reads its ``.npy`` header alone and checks the dtype (its kind, never an
  object, structured or wider-than-8-byte numeric one) and the shape (``Member.shape``: fixed
  lengths, named lengths shared between members and bounded by ``dims``), so the declared bytes
  are bounded by what the file should hold *before anything is allocated*; the member's zip entry
  must hold exactly the header and those bytes (a lie about either is damage), and is read to its
  end so its CRC-32 is checked. ``lazy`` members are checked but not read (``NpyHeader``;
  ``open_member`` streams them).
- ``read_npy(data, where, member)`` is the same for a plain ``.npy`` held in memory.
- ``open_npz(path, what)`` is ``numpy.load`` of an archive of any layout (``allow_pickle`` off)
  for files checked afterwards by digest (weights): every member's header checked against its
  entry first, so nothing allocated exceeds what the file holds.

Every failure is ``NotAnNpzError`` (an ``UnreadableFileError``, a ``ValueError``): one line naming
``what``, the file, the member, and what was expected. Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tokenize
import zipfile
from collections.abc import Mapping
from typing import IO, Literal

import numpy as np

from dew.bounded_zip import ZIP_ERRORS, UnreadableFileError, entry_info, open_archive, read_exactly, reason

EXPECTED = "an .npz archive (a zip of .npy arrays, as numpy.savez writes)"
HEADER_BYTES = 10_000  # numpy's own limit on a .npy header (``max_header_size``)
Dim = int | str | None


class NotAnNpzError(UnreadableFileError):
    """The file is not a readable ``.npz`` (or ``.npy``) of what was expected; the message names
    the flag, the file and the member."""


@dataclasses.dataclass(frozen=True)
class Member:
    """What one array must be: a dtype of one of ``kinds`` (numpy kind letters: ``"f"`` float,
    ``"iu"`` integer, ``"U"`` text, ``"b"`` bool); a ``shape`` (None: any rank) whose entries are
    a fixed length, a name (``"D"``: the same length wherever the schema uses it, at most
    ``dims["D"]``) or None (any length: then ``max_bytes`` bounds it); at most ``max_bytes``."""

    kinds: str
    shape: tuple[Dim, ...] | None = None
    max_bytes: int | None = None
    required: bool = True

    def describe(self) -> str:
        kind = "/".join(_KIND_NAMES.get(k, k) for k in self.kinds)
        shape = "any shape" if self.shape is None else "[" + ", ".join(_dim(d) for d in self.shape) + "]"
        return f"{kind} {shape}" + (f" of at most {self.max_bytes} bytes" if self.max_bytes else "")


_KIND_NAMES = {"f": "float", "i": "int", "u": "uint", "U": "text", "b": "bool"}


def _dim(d: Dim) -> str:
    return "N" if d is None else str(d)


@dataclasses.dataclass(frozen=True)
class NpyHeader:
    """A lazy member: its checked ``shape`` and ``dtype``, Fortran order or not."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool


def _header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of the ``.npy`` stream ``f``, left at its data; a header
    numpy's parser cannot read (its ``SyntaxError``, ``TokenError``) is a ``ValueError``."""
    version = np.lib.format.read_magic(f)
    try:
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=HEADER_BYTES)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=HEADER_BYTES)
        else:
            raise ValueError(f"unknown .npy format version {version}")
    except (SyntaxError, tokenize.TokenError, TypeError) as e:
        raise ValueError(f"its .npy header cannot be parsed ({type(e).__name__})") from None
    return tuple(int(n) for n in shape), bool(fortran), np.dtype(dtype)


def _check(
    shape: tuple[int, ...], dtype: np.dtype, member: Member, bound: dict[str, int], dims: Mapping[str, int]
) -> str | None:
    """Why ``dtype`` ``shape`` is not ``member`` (None when it is), binding named lengths."""
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in member.kinds:
        return f"is {dtype}"
    if dtype.kind in "fiub" and dtype.itemsize > 8:
        return f"is {dtype} ({dtype.itemsize}-byte elements)"
    if member.shape is not None:
        if len(shape) != len(member.shape):
            return f"has shape {shape}"
        for n, want in zip(shape, member.shape, strict=True):
            if isinstance(want, int) and n != want:
                return f"has shape {shape}"
            if isinstance(want, str):
                if want in bound and bound[want] != n:
                    return f"has shape {shape} ({want}={bound[want]} elsewhere)"
                if n > dims.get(want, n):
                    return f"has shape {shape}"  # the bound follows, with what was expected
    nbytes = math.prod(shape) * dtype.itemsize
    if member.max_bytes is not None and nbytes > member.max_bytes:
        return f"is {dtype} {shape}, {nbytes} bytes"
    if member.shape is not None:
        for n, want in zip(shape, member.shape, strict=True):
            if isinstance(want, str):
                bound.setdefault(want, n)
    return None


def _read_data(
    f: IO[bytes], shape: tuple[int, ...], dtype: np.dtype, fortran: bool, where: str
) -> np.ndarray:
    array = np.empty(math.prod(shape), dtype)
    if array.nbytes:
        read_exactly(f, array, where)
    if f.read(1):  # also reads the entry to its end: the CRC-32 is checked there
        raise ValueError("holds bytes after its array")
    return array.reshape(shape, order="F" if fortran else "C")


def read_npz(
    path: str | os.PathLike,
    what: str,
    schema: Mapping[str, Member],
    *,
    dims: Mapping[str, int] | None = None,
    others: Literal["refuse", "ignore"] = "refuse",
    default: Member | None = None,
    lazy: frozenset[str] = frozenset(),
) -> dict[str, np.ndarray | NpyHeader]:
    """The members of the ``.npz`` at ``path`` that ``schema`` names (and, with a ``default``,
    every other member, checked against it), each checked (module docstring) before it is read;
    ``lazy`` ones as their ``NpyHeader``. ``NotAnNpzError`` in one line naming ``what``, the file
    and the member otherwise (``FileNotFoundError`` passes)."""
    where = f"{what}: {os.fspath(path)}"
    dims = dict(dims or {})
    archive = _open(path, what)
    bound: dict[str, int] = {}
    out: dict[str, np.ndarray | NpyHeader] = {}
    with archive:
        try:
            names = [info.filename for info in archive.infolist()]
        except ZIP_ERRORS as e:
            raise NotAnNpzError(f"{where} is not {EXPECTED} ({reason(e)})") from None
        members = [n.removesuffix(".npy") for n in names]
        if len(set(members)) != len(members):
            raise NotAnNpzError(f"{where} names a member twice ({sorted(members)}); expected {EXPECTED}")
        missing = [k for k, m in schema.items() if m.required and k not in members]
        unknown = [k for k in members if k not in schema and default is None]
        if missing or (unknown and others == "refuse"):
            raise NotAnNpzError(
                f"{where} holds {sorted(members)}"
                + (f", lacking {missing}" if missing else "")
                + (f", with unknown {unknown}" if unknown and others == "refuse" else "")
                + f"; expected {sorted(schema)}"
            )
        wanted = [*(k for k in schema if k in members), *(k for k in members if k not in schema)]
        for key in wanted:
            member = schema.get(key, default)
            name = names[members.index(key)]
            if member is not None:
                out[key] = _member(archive, name, key, member, bound, dims, key in lazy, where)
            else:  # not read, but an entry the directory misnames is damage all the same
                _local_header(archive, name, where)
    return out


def _local_header(archive: zipfile.ZipFile, name: str, where: str) -> None:
    """Refuse an entry whose local header disagrees with the directory (``zipfile`` compares
    them when the entry is opened); nothing of it is read."""
    try:
        archive.open(name).close()
    except ZIP_ERRORS as e:
        raise NotAnNpzError(f"{where}: entry {name!r} cannot be read ({reason(e)})") from None


def _member(
    archive: zipfile.ZipFile,
    name: str,
    key: str,
    member: Member,
    bound: dict[str, int],
    dims: Mapping[str, int],
    lazy: bool,
    where: str,
) -> np.ndarray | NpyHeader:
    at = f"{where}: member {key!r}"
    try:
        info = entry_info(archive, name, archive.getinfo(name).file_size, where)
        with archive.open(info) as f:
            shape, fortran, dtype = _header(f)
            why = _check(shape, dtype, member, bound, dims)
            if why is not None:
                raise NotAnNpzError(f"{at} {why}; expected {member.describe()}{_dims_text(member, dims)}")
            nbytes = math.prod(shape) * dtype.itemsize
            if f.tell() + nbytes != info.file_size:
                raise NotAnNpzError(
                    f"{at} declares {dtype} {shape} ({nbytes} bytes) in an entry of {info.file_size} "
                    "bytes (damaged or truncated)"
                )
            if lazy:
                return NpyHeader(shape, dtype, fortran)
            return _read_data(f, shape, dtype, fortran, at)
    except UnreadableFileError as e:
        raise NotAnNpzError(str(e)) from None
    except ZIP_ERRORS as e:
        raise NotAnNpzError(f"{at} cannot be read ({reason(e)}); expected {member.describe()}") from None


def _dims_text(member: Member, dims: Mapping[str, int]) -> str:
    named = [d for d in member.shape or () if isinstance(d, str) and d in dims]
    return f" ({', '.join(f'{d} at most {dims[d]}' for d in dict.fromkeys(named))})" if named else ""


def open_npy_member(path: str | os.PathLike, key: str, header: NpyHeader, what: str) -> IO[bytes]:
    """The open entry of a ``lazy`` member, positioned at its data (the caller reads it in
    pieces, to its end for the CRC-32); ``NotAnNpzError`` when it changed since it was checked."""
    where = f"{what}: {os.fspath(path)}: member {key!r}"
    try:
        with open_archive(path, what, EXPECTED) as archive:  # the entry keeps the file open
            f = archive.open(f"{key}.npy")
        if _header(f) != (header.shape, header.fortran, header.dtype):
            raise ValueError("its header changed since it was read")
    except UnreadableFileError as e:
        raise NotAnNpzError(str(e)) from None
    except (*ZIP_ERRORS, KeyError) as e:
        raise NotAnNpzError(f"{where} cannot be read ({reason(e)})") from None
    return f


def read_npy(data: bytes, where: str, member: Member, dims: Mapping[str, int] | None = None) -> np.ndarray:
    """The ``.npy`` array in ``data``, checked against ``member`` (module docstring) before it is
    allocated; ``NotAnNpzError`` beginning with ``where`` otherwise."""
    import io

    f = io.BytesIO(data)
    try:
        shape, fortran, dtype = _header(f)
        why = _check(shape, dtype, member, {}, dict(dims or {}))
        if why is not None:
            raise NotAnNpzError(f"{where} {why}; expected {member.describe()}")
        if f.tell() + math.prod(shape) * dtype.itemsize != len(data):
            raise NotAnNpzError(
                f"{where} declares {dtype} {shape} in {len(data)} bytes (damaged or truncated)"
            )
        return _read_data(f, shape, dtype, fortran, where)
    except NotAnNpzError:
        raise
    except (*ZIP_ERRORS, UnreadableFileError) as e:
        raise NotAnNpzError(
            f"{where} is not a .npy array ({reason(e)}); expected {member.describe()}"
        ) from None


def _open(path: str | os.PathLike, what: str) -> zipfile.ZipFile:
    """The archive at ``path``; ``NotAnNpzError`` saying what the file is instead (empty, a
    single ``.npy``, neither a zip nor a ``.npy``, a torn zip). ``FileNotFoundError`` passes."""
    try:
        return open_archive(path, what, EXPECTED)
    except UnreadableFileError as e:
        try:
            with open(path, "rb") as f:
                start = f.read(6)
        except OSError:
            raise NotAnNpzError(str(e)) from None
        if not start:
            why = "it is empty"
        elif start == b"\x93NUMPY":
            raise NotAnNpzError(
                f"{what}: {os.fspath(path)} holds a single .npy array, not {EXPECTED}"
            ) from None
        elif not start.startswith(b"PK"):
            why = "it is neither a zip archive nor a .npy array"
        else:
            why = str(e).rsplit(" (", 1)[-1].rstrip(")")
        raise NotAnNpzError(f"{what}: {os.fspath(path)} is not {EXPECTED} ({why})") from None


class _CheckedNpz(np.lib.npyio.NpzFile):
    """``numpy``'s ``NpzFile`` whose members' damage (a bad CRC-32, a torn entry) is one
    ``NotAnNpzError`` line naming the file and the member."""

    def __init__(self, path: str | os.PathLike, what: str):
        self.where = f"{what}: {os.fspath(path)}"
        super().__init__(open(path, "rb"), own_fid=True, allow_pickle=False)  # noqa: SIM115  (closed by close())

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return super().__getitem__(key)
        except ZIP_ERRORS as e:
            raise NotAnNpzError(f"{self.where}: member {key!r} cannot be read ({reason(e)})") from None


def open_npz(path: str | os.PathLike, what: str) -> np.lib.npyio.NpzFile:
    """``np.load(path, allow_pickle=False)`` of the ``.npz`` at ``path``, for use in a ``with``
    block, for files of any layout checked afterwards (weights, by digest): every member's
    ``.npy`` header is first checked against its zip entry (never an object array, never more
    bytes than the entry holds, and an entry never more than its compressed bytes can inflate
    to), so nothing allocated is larger than the file can hold; a member's damage found as it
    is read is ``NotAnNpzError`` too. ``NotAnNpzError`` naming ``what`` (e.g.
    ``"--state_dict"``) and the file otherwise; ``FileNotFoundError`` passes through. Where
    the layout is known, ``read_npz`` also bounds each member by it."""
    where = f"{what}: {os.fspath(path)}"
    with _open(path, what) as archive:
        try:
            infos = archive.infolist()
        except ZIP_ERRORS as e:
            raise NotAnNpzError(f"{where} is not {EXPECTED} ({reason(e)})") from None
        for info in infos:
            if info.filename.endswith(".npy"):
                key = info.filename.removesuffix(".npy")
                _member(archive, info.filename, key, Member("fiubcUS"), {}, {}, True, where)
    return _CheckedNpz(path, what)


__all__ = [
    "EXPECTED",
    "Member",
    "NotAnNpzError",
    "NpyHeader",
    "open_npy_member",
    "open_npz",
    "read_npy",
    "read_npz",
]
