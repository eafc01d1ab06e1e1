"""``torch.save`` files in PyTorch's zip format (every PyTorch since 1.6: DiT's published
``DiT-XL-2-256x256.pt``, SiT's, and the ``{"model", "ema", "opt", "args"}`` their ``train.py``
saves), read without PyTorch and without executing anything they name.

What such a file is (``torch/serialization.py`` ``_save``): a zip whose entries share one prefix
directory, holding ``<prefix>/data.pkl`` (the object, pickled at protocol 2, each tensor a
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`` call,
parameters inside ``torch._utils._rebuild_parameter``, each storage a persistent id
``('storage', torch.<Type>Storage, key, location, numel)``), ``<prefix>/data/<key>`` (each
storage's raw little-endian elements) and ``<prefix>/byteorder`` (``little``; absent in files
older than PyTorch 1.13, which were little-endian).

``read`` resolves only the globals such a checkpoint names (``ALLOWED``: the tensor and parameter
rebuilds and storage types, as ``dew.interop.edm_pickle`` reads them, ``collections.OrderedDict``
and ``argparse.Namespace``, whose record is data), builds numpy arrays in place of tensors, and
bounds what it builds by the file's size (``dew.interop.pickle_bounds``: the opcodes are read
first, each storage is checked against its entry's length before it is allocated, and the loaded
graph is walked once). Every entry is read through ``dew.bounded_zip``: at most what it should
hold (the byte-order entry a few bytes, ``data.pkl`` the bounds' array bytes, a storage its
elements), to its end so its CRC-32 is checked; an encrypted entry is refused. Anything else is
``PickleRefused`` naming it, one line.
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import pickle
import zipfile
from typing import Any

import numpy as np

from dew.bounded_zip import ZIP_ERRORS, UnreadableFileError, entry_info, read_entry, read_exactly, reason
from dew.interop.pickle_bounds import Bounds, PickleRefused, active, charge, check_graph, check_opcodes
from dew.interop.torch_storage import STORAGE_DTYPES, StorageType, rebuild_parameter, rebuild_tensor_v2

BYTEORDER_BYTES = 16  # "little" or "big", perhaps with a newline

ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("argparse", "Namespace"): argparse.Namespace,  # train.py's args: a record of plain values
}
"""Every global a DiT / SiT / REPA checkpoint refers to besides the storage types."""


class _ZipUnpickler(pickle.Unpickler):
    """``data.pkl``'s unpickler: ``ALLOWED`` and ``torch.<Type>Storage`` globals only, storages
    read from the zip's ``data/<key>`` entries."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix = archive, prefix
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in STORAGE_DTYPES:
            return StorageType(name, np.dtype(STORAGE_DTYPES[name]))
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise PickleRefused(
                f"refused global {module}.{name}: a DiT/SiT checkpoint needs only torch tensors and "
                "storages, collections.OrderedDict and argparse.Namespace"
            ) from None

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise PickleRefused(f"unexpected persistent id {str(pid)[:80]!r} (expected a tensor storage)")
        storage_type, key, _location, numel = pid[1:]
        if (
            not isinstance(storage_type, StorageType)
            or not isinstance(key, str)
            or not isinstance(numel, int)
        ):
            raise PickleRefused(f"a tensor storage's persistent id {str(pid)[:80]!r} names no storage")
        if key not in self.storages:
            entry = f"{self.prefix}/data/{key}"
            try:
                info = self.archive.getinfo(entry)
            except KeyError:
                raise PickleRefused(f"tensor storage {key}: no {entry} in the archive") from None
            nbytes = numel * storage_type.dtype.itemsize
            if numel < 0 or info.file_size != nbytes:
                raise PickleRefused(
                    f"tensor storage {key}: {info.file_size} bytes for {numel} {storage_type.name} elements"
                )
            charge(nbytes, f"tensor storage {key} ({numel} elements)")
            array = np.empty(numel, storage_type.dtype)
            _read_into(self.archive, entry, array)
            if storage_type.name == "BFloat16Storage":  # the top half of a float32
                charge(4 * array.size, f"a bfloat16 storage of {array.size} elements as float32")
                array = (array.astype(np.uint32) << 16).view(np.float32)
            self.storages[key] = array
        return self.storages[key]


def read(path: str) -> Any:
    """The object ``torch.save`` wrote to ``path``, tensors as numpy arrays (module docstring).
    ``PickleRefused`` (one line naming ``path``) for anything but a zip-format checkpoint of
    tensors, containers and plain values."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise PickleRefused(
            f"{path} is not a zip-format torch.save file (PyTorch >= 1.6 writes that by default; re-save "
            "it with torch.save, or export the state dict to .npz)"
        ) from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise PickleRefused(f"{path}: expected one <prefix>/data.pkl entry, found {len(pickles)}")
        prefix = pickles[0].split("/", 1)[0]
        byteorder = f"{prefix}/byteorder"
        bounds = Bounds(os.path.getsize(path))
        try:
            order = (
                read_entry(archive, byteorder, BYTEORDER_BYTES, path)
                if byteorder in archive.namelist()
                else None
            )
            if order is not None and order.strip() != b"little":  # "little" or "big": a few bytes
                raise PickleRefused(f"{path}: saved big-endian ({byteorder}); expected a little-endian file")
            data = read_entry(archive, pickles[0], bounds.array_bytes, path)
        except UnreadableFileError as e:
            raise PickleRefused(str(e)) from None
        try:
            check_opcodes(io.BytesIO(data), f"{path} (data.pkl)")
            with active(bounds):
                top = _ZipUnpickler(data, archive, prefix).load()
            check_graph(top, bounds, name=path, expand=_namespace_items)
        except UnreadableFileError as e:  # a storage entry: torn, encrypted, a bad CRC-32
            raise PickleRefused(f"{path}: {str(e).removeprefix(f'{path}: ')}") from None
        except PickleRefused as e:
            raise PickleRefused(f"{path}: {str(e).removeprefix(f'{path}: ')}") from None
        except Exception as e:  # a truncated or corrupt record: whatever the unpickler stopped on
            raise PickleRefused(
                f"{path} is not a readable checkpoint ({type(e).__name__}: {str(e)[:200]})"
            ) from None
    return top


def _read_into(archive: zipfile.ZipFile, entry: str, array: np.ndarray) -> None:
    """Fill ``array`` with ``entry``'s bytes (exactly its size, read to the end: the CRC-32 is
    checked); ``UnreadableFileError`` naming the entry otherwise."""
    where = f"entry {entry!r}"
    info = entry_info(archive, entry, array.nbytes, where)
    try:
        with archive.open(info) as f:
            read_exactly(f, array, where)
            if f.read(1):
                raise UnreadableFileError(f"{where} holds more than {array.nbytes} bytes")
    except UnreadableFileError:
        raise
    except ZIP_ERRORS as e:
        raise UnreadableFileError(f"{where} cannot be read ({reason(e)})") from None


def _namespace_items(value: Any) -> list | None:
    return list(vars(value).items()) if isinstance(value, argparse.Namespace) else None


__all__ = ["ALLOWED", "read"]
