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

``RestrictedUnpickler`` resolves exactly those globals, each to a stand-in (here, or for tensors
and storages in ``dew.interop.torch_storage``) that
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
import os
import pickle
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np

from dew.interop.pickle_bounds import Bounds, PickleRefused, active, check_graph, check_opcodes
from dew.interop.torch_storage import LEGACY_MAGIC as LEGACY_MAGIC
from dew.interop.torch_storage import LEGACY_PROTOCOL as LEGACY_PROTOCOL
from dew.interop.torch_storage import load_from_bytes, rebuild_parameter, rebuild_tensor_v2


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
    ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): rebuild_parameter,
    ("torch.storage", "_load_from_bytes"): load_from_bytes,
    ("torch.nn.modules.container", "ModuleDict"): _ModuleDict,
    ("torch.nn.modules.container", "ModuleList"): _ModuleList,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("numpy", "dtype"): _numpy_dtype,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
}
"""Every global an NVlabs/edm network pickle refers to, each mapped to its plain-data stand-in."""


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
