"""PyTorch tensors as a pickle describes them, rebuilt as numpy arrays without PyTorch: what both
readers of PyTorch's files share (``dew.interop.edm_pickle``: NVlabs/edm network pickles, whose
storages are legacy ``torch.save`` bytes; ``dew.interop.torch_zip``: the zip ``.pt`` format).

* ``StorageType``: ``torch.<Name>Storage`` as the dtype of its elements (``STORAGE_DTYPES``;
  bfloat16 stored as uint16 and widened to float32);
* ``load_from_bytes``: ``torch.storage._load_from_bytes(b)``, ``b`` a legacy (non-zip)
  ``torch.save`` of one storage (``LEGACY_MAGIC``, ``LEGACY_PROTOCOL``, then the storage's
  persistent id and its raw little-endian elements);
* ``rebuild_tensor_v2`` / ``rebuild_parameter``: ``torch._utils._rebuild_tensor_v2`` and
  ``rebuild_parameter``, a copy of the strided view.

Every allocation is charged to the active ``dew.interop.pickle_bounds.Bounds`` before it is
made, and a tensor may not reach beyond its storage: a ``PickleRefused`` otherwise."""

from __future__ import annotations

import dataclasses
import io
import math
import pickle
from typing import Any, BinaryIO

import numpy as np

from dew.interop.pickle_bounds import PickleRefused, charge, check_opcodes


@dataclasses.dataclass(frozen=True)
class StorageType:
    """``torch.<Name>Storage`` as the dtype of its elements (bfloat16: stored as uint16)."""

    name: str
    dtype: np.dtype


STORAGE_DTYPES = {
    "FloatStorage": "<f4",
    "DoubleStorage": "<f8",
    "HalfStorage": "<f2",
    "BFloat16Storage": "<u2",
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


class _LegacyUnpickler(pickle.Unpickler):
    """The object pickle inside a legacy ``torch.save``: storage types, storage persistent ids."""

    def __init__(self, file: BinaryIO, size: int):
        super().__init__(file)
        self.size = size  # bytes in the whole storage record: no storage is larger
        self.roots: dict[str, tuple[StorageType, np.ndarray]] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in STORAGE_DTYPES:
            return StorageType(name, np.dtype(STORAGE_DTYPES[name]))
        raise PickleRefused(f"refused global {module}.{name} inside a tensor storage")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage"):
            raise PickleRefused(f"unexpected persistent id in a tensor storage: {str(pid)[:80]}")
        storage_type, key, _location, numel, view = pid[1:]
        if not isinstance(storage_type, StorageType) or not isinstance(key, str):
            raise PickleRefused("a tensor storage's persistent id names no storage type / key")
        if not isinstance(numel, int) or not 0 <= numel * storage_type.dtype.itemsize <= self.size:
            raise PickleRefused(f"a tensor storage of {numel!r} elements in a {self.size}-byte record")
        if key not in self.roots:
            charge(numel * storage_type.dtype.itemsize, f"tensor storage {key} ({numel} elements)")
            self.roots[key] = (storage_type, np.zeros(numel, storage_type.dtype))
        root = self.roots[key][1]
        if view is None:
            return root
        _view_key, offset, size = view
        if not (
            isinstance(offset, int) and isinstance(size, int) and 0 <= offset <= offset + size <= root.size
        ):
            raise PickleRefused(f"a storage view [{offset!r}:+{size!r}] outside its {root.size} elements")
        return root[offset : offset + size]


def load_from_bytes(data: Any) -> np.ndarray:
    """Stands in for ``torch.storage._load_from_bytes``: the storage's elements as a 1-D array."""
    if not isinstance(data, bytes):
        raise PickleRefused(f"torch.storage._load_from_bytes of a {type(data).__name__}")
    if data[:2] == b"PK":
        raise PickleRefused("a tensor storage in torch's zip format (this reader takes the legacy format)")
    f = io.BytesIO(data)

    def load(unpickler: _LegacyUnpickler) -> Any:
        check_opcodes(f, "a tensor storage")
        return unpickler.load()

    header = _LegacyUnpickler(f, len(data))
    if load(header) != LEGACY_MAGIC or load(header) != LEGACY_PROTOCOL:
        raise PickleRefused("a tensor storage without torch's legacy magic number / protocol 1001")
    sys_info = load(header)
    if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
        raise PickleRefused("a tensor storage not written little-endian")
    body = _LegacyUnpickler(f, len(data))
    result = load(body)
    keys = load(_LegacyUnpickler(f, len(data)))
    if not isinstance(keys, list) or set(keys) != set(body.roots):
        raise PickleRefused("a tensor storage whose key list does not match its storages")
    for key in keys:
        root = body.roots[key][1]
        count, nbytes = f.read(8), root.size * root.itemsize
        raw = f.read(nbytes)
        if len(count) != 8 or int(np.frombuffer(count, "<i8")[0]) != root.size or len(raw) != nbytes:
            raise PickleRefused(
                f"tensor storage {key}: data truncated, or not the {root.size} elements declared"
            )
        root[...] = np.frombuffer(raw, root.dtype)
    if not isinstance(result, np.ndarray):
        raise PickleRefused("torch.storage._load_from_bytes holding no storage")
    if result.dtype == np.dtype(STORAGE_DTYPES["BFloat16Storage"]):  # the top half of a float32
        charge(4 * result.size, f"a bfloat16 storage of {result.size} elements as float32")
        result = (result.astype(np.uint32) << 16).view(np.float32)
    return result


def rebuild_tensor_v2(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, metadata: Any = None
) -> np.ndarray:
    """Stands in for ``torch._utils._rebuild_tensor_v2``: a copy of the strided view, bounds checked."""
    del requires_grad, hooks, metadata
    if not isinstance(storage, np.ndarray) or storage.ndim != 1:
        raise PickleRefused("torch._utils._rebuild_tensor_v2 of something that is not a storage")
    ints = (size, stride)
    if not (
        isinstance(offset, int)
        and offset >= 0
        and all(isinstance(t, tuple) and all(isinstance(i, int) and i >= 0 for i in t) for t in ints)
        and len(size) == len(stride)
    ):
        raise PickleRefused(f"a tensor with offset {offset!r}, size {size!r}, stride {stride!r}")
    if len(size) > 32:
        raise PickleRefused(f"a tensor of {len(size)} dimensions")
    if 0 in size:
        return np.zeros(size, storage.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= storage.size:
        raise PickleRefused(
            f"a tensor of size {size} reading element {last} of a {storage.size}-element storage"
        )
    numel = math.prod(size)
    if numel > storage.size:  # only repeated (stride-0) elements could make it so: never saved
        raise PickleRefused(
            f"a tensor of size {size} (stride {stride}) holds {numel} elements, more than its "
            f"{storage.size}-element storage"
        )
    charge(numel * storage.itemsize, f"a tensor of size {size}")
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=tuple(s * storage.itemsize for s in stride), writeable=False
    )
    return np.array(view, copy=True)


def rebuild_parameter(data: Any, requires_grad: Any, hooks: Any, state: Any = None) -> np.ndarray:
    """Stands in for ``torch._utils._rebuild_parameter`` (and ``..._with_state``): the data."""
    del requires_grad, hooks, state
    if not isinstance(data, np.ndarray):
        raise PickleRefused("torch._utils._rebuild_parameter of something that is not a tensor")
    return data
