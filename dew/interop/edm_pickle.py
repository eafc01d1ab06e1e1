"""NVlabs/edm network pickles (``network-snapshot-*.pkl``, the published ``edm-*.pkl``), read
without executing the code they embed and without PyTorch.

What such a file is (``training/training_loop.py`` writes it with ``pickle.dump``):

* a dict ``{'ema': net, 'loss_fn': ..., 'augment_pipe': ... or None, 'dataset_kwargs': {...}}``;
* every module of ``training/networks.py`` (and the loss and augmentation pipe) is a
  ``torch_utils.persistence`` class, pickled as ``_reconstruct_persistent_obj(meta)`` with
  ``meta = {type: 'class', version, module_src, class_name, state}``: ``module_src`` is the source
  of the module defining the class (the reference ``exec``s it to load), ``state`` the object's
  ``__dict__``, which holds the constructor arguments as ``_init_args`` / ``_init_kwargs`` and, for
  a ``torch.nn.Module``, its ``_parameters``, ``_buffers`` and ``_modules``;
* ``torch.nn.ModuleDict`` children are plain ``copyreg`` objects (class, then ``BUILD`` state);
* a tensor is ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
  hooks)`` (inside ``_rebuild_parameter`` for parameters); its storage is
  ``torch.storage._load_from_bytes(b)``, ``b`` being PyTorch's legacy (non-zip) ``torch.save`` of
  that storage: five consecutive pickles (magic number, protocol 1001, system info, the storage as
  a persistent id ``('storage', torch.<Type>Storage, key, location, numel, view)``, the storage
  keys) followed, per key, by an int64 element count and the raw little-endian elements;
* numpy scalars (e.g. ``skip_scale=np.sqrt(0.5)`` in constructor arguments) as
  ``numpy.core.multiarray.scalar(dtype, bytes)``.

``RestrictedUnpickler`` resolves exactly those globals, each to a function defined here that
builds plain data: a ``PickledModule`` (class name, constructor arguments, state) in place of
every persistent object and module container (``module_src`` is hashed, never run), numpy arrays
in place of tensors. Any other global (``os.system``, ``builtins.eval``, ...) is a
``PickleRefused`` naming it, raised before anything it names is looked up.

What it builds is bounded by the file's size (``dew.interop.pickle_bounds``), so a small
hostile file cannot take the memory: each pickle's opcodes are read first and a memo index
beyond their count is refused before the unpickler sizes its memo by it; a tensor may not hold
more elements than its storage (a stride-0 tensor of a one-element storage would otherwise be
allocated whole), and the arrays built together may not exceed a multiple of the file's size,
checked before each is allocated; the object graph loaded is walked once and refused when it
refers to itself, nests deeper than any network's record, or expands (shared references counted
at each use, as a reader of the record walks them) to more objects than the file could describe.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import math
import os
import pickle
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np

from dew.interop.pickle_bounds import Bounds, PickleRefused, active, charge, check_graph, check_opcodes


class NotAnEDMNetwork(ValueError):
    """A pickle that loads safely but holds no NVlabs/edm network snapshot."""


# --- plain-data stand-ins for what the pickle reconstructs ------------------------------------


@dataclasses.dataclass
class PickledModule:
    """One reconstructed object, as data: ``class_name``, ``state`` (its ``__dict__``), where it
    came from (``origin``: ``persistent`` for a ``torch_utils.persistence`` class, whose source
    is summarised by ``module_sha256``; ``container`` for a ``torch.nn`` container)."""

    class_name: str
    state: dict
    origin: str = "persistent"
    module_sha256: str | None = None
    version: int | None = None

    @property
    def init_kwargs(self) -> dict:
        """The keyword arguments it was constructed with (``persistence``'s record)."""
        kwargs = self.state.get("_init_kwargs")
        if not isinstance(kwargs, Mapping):
            raise NotAnEDMNetwork(f"{self.class_name}: the pickle records no constructor arguments")
        return dict(kwargs)

    @property
    def init_args(self) -> tuple:
        return tuple(self.state.get("_init_args") or ())

    def children(self) -> dict[str, PickledModule]:
        modules = self.state.get("_modules") or {}
        return {k: v for k, v in modules.items() if v is not None}

    def state_dict(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Parameters and persistent buffers by dotted name, as ``torch.nn.Module.state_dict``."""
        out: dict[str, np.ndarray] = {}
        for name, value in (self.state.get("_parameters") or {}).items():
            if value is not None:
                out[prefix + name] = _array(value, prefix + name)
        skipped = set(self.state.get("_non_persistent_buffers_set") or ())
        for name, value in (self.state.get("_buffers") or {}).items():
            if value is not None and name not in skipped:
                out[prefix + name] = _array(value, prefix + name)
        for name, child in self.children().items():
            if not isinstance(child, PickledModule):
                raise NotAnEDMNetwork(f"child {prefix}{name} is a {type(child).__name__}, not a module")
            out.update(child.state_dict(f"{prefix}{name}."))
        return out


def _array(value: Any, name: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise NotAnEDMNetwork(f"parameter {name} is a {type(value).__name__}, not a tensor")
    return value


class _Container(PickledModule):
    """A ``torch.nn`` container rebuilt by ``NEWOBJ`` + ``BUILD``: the state becomes data."""

    container_name = "Module"

    def __init__(self, *args: Any) -> None:
        if args:
            raise PickleRefused(f"torch.nn.{self.container_name}: unexpected constructor arguments")
        super().__init__(self.container_name, {}, origin="container")

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise PickleRefused(f"torch.nn.{self.container_name}: state is a {type(state).__name__}")
        self.state = state


class _ModuleDict(_Container):
    container_name = "ModuleDict"


class _ModuleList(_Container):
    container_name = "ModuleList"


def _reconstruct_persistent_obj(meta: Any) -> PickledModule:
    """Stands in for ``torch_utils.persistence._reconstruct_persistent_obj``: records, never runs."""
    if not isinstance(meta, dict) or meta.get("type") != "class":
        raise PickleRefused("torch_utils.persistence: a persistent object whose meta is not a 'class' record")
    name, source, state = meta.get("class_name"), meta.get("module_src"), meta.get("state")
    if not isinstance(name, str) or not isinstance(source, str) or not isinstance(state, dict):
        raise PickleRefused("torch_utils.persistence: meta lacks class_name / module_src / state")
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    version = meta.get("version")
    return PickledModule(name, state, "persistent", digest, version if isinstance(version, int) else None)


# --- tensors and their storages ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _StorageType:
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
        self.roots: dict[str, tuple[_StorageType, np.ndarray]] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name, np.dtype(STORAGE_DTYPES[name]))
        raise PickleRefused(f"refused global {module}.{name} inside a tensor storage")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage"):
            raise PickleRefused(f"unexpected persistent id in a tensor storage: {str(pid)[:80]}")
        storage_type, key, _location, numel, view = pid[1:]
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str):
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


def _load_from_bytes(data: Any) -> np.ndarray:
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


def _rebuild_tensor_v2(
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


def _rebuild_parameter(data: Any, requires_grad: Any, hooks: Any, state: Any = None) -> np.ndarray:
    """Stands in for ``torch._utils._rebuild_parameter`` (and ``..._with_state``): the data."""
    del requires_grad, hooks, state
    if not isinstance(data, np.ndarray):
        raise PickleRefused("torch._utils._rebuild_parameter of something that is not a tensor")
    return data


# --- numpy scalars ----------------------------------------------------------------------------


def _numpy_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    if not (isinstance(spec, str) and spec.lstrip("<>|=")[:1] in tuple("biufc?")):
        raise PickleRefused(f"numpy.dtype({spec!r}): only numeric dtypes are read")
    dtype = np.dtype(spec, align=bool(align), copy=bool(copy))
    if dtype.kind not in "biufc" or dtype.fields is not None:
        raise PickleRefused(f"numpy.dtype({spec!r}): only numeric dtypes are read")
    return dtype


def _numpy_scalar(dtype: Any, data: Any) -> np.generic:
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biufc" or not isinstance(data, bytes):
        raise PickleRefused("numpy scalar of a non-numeric dtype")
    if len(data) != dtype.itemsize:
        raise PickleRefused(f"numpy scalar of {len(data)} bytes for dtype {dtype}")
    return np.frombuffer(data, dtype)[0]


ALLOWED = {
    ("torch_utils.persistence", "_reconstruct_persistent_obj"): _reconstruct_persistent_obj,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch.storage", "_load_from_bytes"): _load_from_bytes,
    ("torch.nn.modules.container", "ModuleDict"): _ModuleDict,
    ("torch.nn.modules.container", "ModuleList"): _ModuleList,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("numpy", "dtype"): _numpy_dtype,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
}
"""Every global an NVlabs/edm network pickle refers to, each mapped to a stand-in from this module."""


def _module_items(value: Any) -> list | None:
    """A reconstructed module's state as ``(attribute, value)`` pairs, for ``check_graph``."""
    if isinstance(value, PickledModule):
        return list(value.state.items()) if isinstance(value.state, dict) else []
    return None


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only ``ALLOWED`` (to this module's stand-ins), and
    builds no more than ``Bounds`` of the file's size allows (``size``: default, the file's
    length from where it is read)."""

    def __init__(self, file: BinaryIO, size: int | None = None) -> None:
        super().__init__(file)
        self.file = file
        if size is None:
            here = file.tell()
            size = file.seek(0, os.SEEK_END) - here
            file.seek(here)
        self.bounds = Bounds(int(size))

    def load(self) -> Any:
        """The object the pickle describes, or ``PickleRefused`` when it exceeds ``bounds``."""
        check_opcodes(self.file)
        with active(self.bounds):
            top = super().load()
        check_graph(top, self.bounds, expand=_module_items)
        return top

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise PickleRefused(
                f"refused global {module}.{name}: an NVlabs/edm network pickle needs only torch tensors "
                "and storages, torch_utils.persistence objects, torch.nn containers, "
                "collections.OrderedDict and numpy scalars"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise PickleRefused(f"refused persistent id {str(pid)[:60]!r} (pickle.dump writes none)")


# --- the snapshot -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EDMSnapshot:
    """What an NVlabs/edm network pickle holds, as data."""

    network: PickledModule
    loss: PickledModule | None
    augment_pipe: PickledModule | None
    dataset_kwargs: dict | None

    def state_dict(self) -> dict[str, np.ndarray]:
        """The network's state dict (``ema.state_dict()``: ``model.<...>`` keys)."""
        return self.network.state_dict()


def read_snapshot(file: BinaryIO, name: str = "the pickle") -> EDMSnapshot:
    """Read an NVlabs/edm snapshot from ``file`` with ``RestrictedUnpickler``.

    Raises ``PickleRefused`` (a global or construct outside ``ALLOWED``) or ``NotAnEDMNetwork``
    (it loads but holds no ``{'ema': <persistent network>, ...}``), each one line naming ``name``.
    """
    try:
        top = RestrictedUnpickler(file).load()
    except PickleRefused as e:
        raise PickleRefused(f"{name}: {str(e).removeprefix('the pickle: ')}") from None
    except Exception as e:  # a truncated or corrupt file: whatever the unpickler stopped on
        raise NotAnEDMNetwork(
            f"{name} is not a readable pickle ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    if not isinstance(top, dict) or not isinstance(top.get("ema"), PickledModule):
        what = (
            f"a dict with keys {sorted(map(str, top))[:6]}"
            if isinstance(top, dict)
            else f"a {type(top).__name__}"
        )
        raise NotAnEDMNetwork(
            f"{name} holds {what}, not an NVlabs/edm network snapshot (a dict whose 'ema' is the network)"
        )
    try:  # every parameter and buffer a tensor, every child a module: named if not
        top["ema"].state_dict()
    except NotAnEDMNetwork as e:
        raise NotAnEDMNetwork(f"{name}: the network's {e}") from None
    loss, augment, dataset = top.get("loss_fn"), top.get("augment_pipe"), top.get("dataset_kwargs")
    return EDMSnapshot(
        network=top["ema"],
        loss=loss if isinstance(loss, PickledModule) else None,
        augment_pipe=augment if isinstance(augment, PickledModule) else None,
        dataset_kwargs=dict(dataset) if isinstance(dataset, dict) else None,
    )


def load_snapshot(path: str) -> EDMSnapshot:
    """``read_snapshot`` of the file at ``path``."""
    with open(path, "rb") as f:
        return read_snapshot(f, path)
