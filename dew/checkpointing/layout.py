"""The items of a dew checkpoint, and the one place a ``TrainState`` is split into them and
rebuilt from them (the orbax store, the local format and ``stored`` all go through here).

A checkpoint holds separately restorable items:

    params/      the live parameters
    opt_state/   the optimizer state
    ema_params/  the raw (not debiased) EMA, so ``restore_ema`` needs neither of the above
    extra/       the small scalars: step, rng key (a typed key, ``jax.random.key``, as its raw
                 ``uint32`` data; its implementation's name in the step's metadata, ``rng_impl``),
                 the EMA's law (``ema``: β's law, the
                 micro-batches per update, the tracked leaves; ``dew.averaging.ema.law``) and,
                 under a dynamic loss scale, its state (``loss_scale``: scale, good steps)
    pending/     gradient sums of an unfinished accumulation (only when the state has them)
    data/        data positions (``positions``)
    dataset/     a caller's own pytree (the stix ``dataset_state``), when one was saved

Also here, as pure helpers: naming leaves the way orbax names them, listing every leaf in which
a template differs from what a checkpoint holds (before any value is read), and the EMA record a
step keeps beside ``extra``'s law (``with_law``, ``law_record``).

Where a checkpoint directory is: a local path or a URI, through orbax's own path type
(``etils.epath``). ``directory("runs/a/checkpoints")`` and
``directory("file:///abs/runs/a/checkpoints")`` name the same local directory;
``directory("gs://bucket/run")`` is a remote one, usable only when the filesystem package for
that scheme is installed. Nothing is opened or created there: the checks are on the text and on
which packages are importable, so a wrong URI fails when a config is read, never by writing
somewhere else (``./gs:/bucket/run``).
"""

from __future__ import annotations

import importlib.util
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

from dew.averaging import ema as ema_lib
from dew.averaging.averager import FIELDS as AVERAGE_FIELDS
from dew.averaging.averager import LAW_EXTRA_KEY, LAW_FIELD
from dew.contracts.state import TrainState

#: The state items, in the order they are written.
STATE_ITEMS = ("params", "opt_state", "ema_params", "extra", "pending", "power_ema")
#: Items every checkpoint has (``pending`` only mid-accumulation).
REQUIRED_ITEMS = ("params", "opt_state", "ema_params", "extra")
DATA_ITEM = "data"
#: Any pytree a caller saves beside the state (the stix ``dataset_state``, e.g. a grain
#: iterator's state): numbers, strings and arrays, stored by orbax like the state items.
DATASET_ITEM = "dataset"
FORMAT = "dew-checkpoint/1"


def items_from_state(state: Any) -> dict[str, Any]:
    """``state``'s fields as checkpoint items (``pending`` only when set). ``state`` may be a
    TrainState of arrays, of ``ShapeDtypeStruct`` (a template) or of None fields.

    The averages follow one rule (``dew.averaging.averager.FIELDS``): each averager's tree is
    the item it names (the classic EMA's, ``ema_params``, always written; the power EMA's,
    ``power_ema``, only when the run tracks one), and the classic EMA's law goes in
    ``extra["ema"]`` (what restore_ema needs besides ema_params, ``ema.law``)."""
    items = {
        "params": state.params,
        "opt_state": state.opt_state,
        "extra": {"step": state.step, "rng": raw_key(state.rng)},
    }
    for field, item in AVERAGE_FIELDS:
        tree = getattr(state, field)
        if tree is not None or item == "ema_params":
            items[item] = tree
    if getattr(state, LAW_FIELD) is not None:
        items["extra"][LAW_EXTRA_KEY] = getattr(state, LAW_FIELD)
    if getattr(state, "loss_scale", None) is not None:  # a dynamic loss scale (dew.training.precision)
        items["extra"]["loss_scale"] = state.loss_scale
    if state.pending is not None:
        items["pending"] = state.pending
    return {name: items[name] for name in STATE_ITEMS if name in items}


def _item(mapping: Mapping[str, Any], key: str) -> Any:
    """``mapping[key]``, None when absent: a restore that skips an item (or an older checkpoint
    without it) leaves that TrainState field unset, which the field's annotation does not model."""
    return mapping.get(key)


def state_from_items(items: Mapping[str, Any]) -> TrainState:
    """The TrainState the items describe; an absent item is an unset (None) field."""
    extra = items.get("extra") or {}
    averages = {field: items.get(item) for field, item in AVERAGE_FIELDS}
    if averages["power_ema"] is not None:  # orbax gives a tuple back as a list
        averages["power_ema"] = tuple(averages["power_ema"])
    return TrainState(
        step=_item(extra, "step"),
        params=items.get("params"),
        opt_state=items.get("opt_state"),
        rng=_item(extra, "rng"),
        pending=items.get("pending"),
        loss_scale=extra.get("loss_scale"),
        **averages,
        **{LAW_FIELD: extra.get(LAW_EXTRA_KEY)},
    )


# --- typed PRNG keys -------------------------------------------------------------------------------
def key_impl(leaf: Any) -> str | None:
    """The PRNG implementation's name (``"threefry2x32"``, ``"rbg"``, ...) of a typed key leaf
    (``jax.random.key``: an array or a ``ShapeDtypeStruct``); None for anything else, e.g. a
    raw ``uint32`` key (``jax.random.PRNGKey``)."""
    dtype = getattr(leaf, "dtype", None)
    # jax/dtypes.py re-exports issubdtype without ``as`` (a jax export bug pyright reports as private).
    if dtype is None or not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # pyright: ignore[reportPrivateImportUsage]
        return None
    if isinstance(leaf, jax.Array):
        return str(jax.random.key_impl(leaf))
    names: list[str] = []
    jax.eval_shape(
        lambda k: names.append(str(jax.random.key_impl(k))) or k, jax.ShapeDtypeStruct(leaf.shape, dtype)
    )
    return names[0]


def raw_key(leaf: Any) -> Any:
    """A typed key as the ``uint32`` data a checkpoint stores (``jax.random.key_data``; for a
    ``ShapeDtypeStruct``, its shape and dtype, placed like the key); anything else as it is."""
    if key_impl(leaf) is None:
        return leaf
    if isinstance(leaf, jax.Array):
        return jax.random.key_data(leaf)
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=getattr(leaf, "sharding", None))


def typed_rng(state: TrainState, template: Any, recorded: str | None, where: str) -> TrainState:
    """``state`` (as restored: its key is raw ``uint32`` data) with the key in the form asked for:
    the template's typed key when the template has one (from a checkpoint of a typed key of the
    same implementation, or of a raw key of the same shape, as written before typed keys were
    recorded), a typed key of the ``recorded`` implementation without a template, else the raw
    data as stored. A typed template of another implementation than the recorded one raises
    ``CheckpointRestorationError`` naming both."""
    wanted = check_key(template, recorded, where)
    if state.rng is None or wanted is None:
        return state
    return state.replace(rng=jax.random.wrap_key_data(state.rng, impl=wanted))


def check_key(template: Any, recorded: str | None, where: str) -> str | None:
    """The key implementation a restore gives (``typed_rng``: the template's, else the recorded
    one; None: raw data), checked before anything is read: a typed template of another
    implementation than the recorded one raises ``CheckpointRestorationError`` naming both."""
    from dew.checkpointing.errors import CheckpointRestorationError

    if recorded is not None and not isinstance(recorded, str):
        raise CheckpointRestorationError(f"{where} is damaged: its metadata records rng_impl={recorded!r}")
    wanted = recorded if template is None else key_impl(template.rng)
    if template is not None and wanted is not None and recorded is not None and wanted != recorded:
        raise CheckpointRestorationError(
            f"{where}: its PRNG key is a {recorded!r} key, the template's a {wanted!r} key; restore onto "
            f"a key made with jax.random.key(..., impl={recorded!r})"
        )
    return wanted


# --- naming leaves the way orbax does ------------------------------------------------------------
def _key_name(key: Any) -> str:
    if isinstance(key, DictKey):
        return str(key.key)
    if isinstance(key, GetAttrKey):
        return key.name
    if isinstance(key, SequenceKey | FlattenedIndexKey):
        return str(key.idx)
    return str(key)


def leaf_names(tree: Any) -> dict[str, Any]:
    """``{"0.mu.w": leaf, ...}``: dotted paths, the names orbax gives the leaves it stores."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(_key_name(k) for k in path): leaf for path, leaf in flat}


def skeleton(tree: Any, path: tuple[Any, ...] = ()) -> Any:
    """``tree`` in the form orbax's metadata gives it back, as JSON: a dict for a mapping or a
    named node (a namedtuple's fields), a list for a sequence, None for a node without leaves
    (``optax.EmptyState()``, None), and each leaf's dotted name (``leaf_names``) in its place.
    A tier without orbax metadata (the local one) keeps this to answer ``stored`` in the same
    shapes as the persistent tier."""
    if not jax.tree.leaves(tree):
        return None
    if jax.tree_util.treedef_is_leaf(jax.tree.structure(tree)):
        return ".".join(_key_name(k) for k in path)
    children, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    if all(isinstance(key, SequenceKey | FlattenedIndexKey) for (key,), _ in children):
        return [skeleton(child, (*path, key)) for (key,), child in children]
    return {_key_name(key): skeleton(child, (*path, key)) for (key,), child in children}


def fill_skeleton(tree: Any, leaves: Mapping[str, Any]) -> Any:
    """A ``skeleton`` with each leaf name replaced by ``leaves[name]``."""
    if isinstance(tree, str):
        return leaves[tree]
    if isinstance(tree, list):
        return [fill_skeleton(child, leaves) for child in tree]
    if isinstance(tree, dict):
        return {key: fill_skeleton(child, leaves) for key, child in tree.items()}
    return None


def stored_leaves(metadata_tree: Any) -> dict[str, Any]:
    """Flatten an orbax metadata tree to ``{dotted name: ArrayMetadata}`` (empty nodes dropped)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(metadata_tree)
    return {".".join(_key_name(k) for k in path): leaf for path, leaf in flat if leaf is not None}


def template_differences(item: str, template: Any, stored: Mapping[str, Any]) -> list[str]:
    """Every leaf in which ``template`` differs from what the checkpoint stores, by name.

    Structure (a leaf only one side has), shape and dtype are compared; an empty list means the
    template can be restored as is.
    """
    wanted = leaf_names(template)
    problems = []
    for name in sorted(set(wanted) | set(stored)):
        if name not in stored:
            problems.append(f"{item}.{name}: in the template, not in the checkpoint")
        elif name not in wanted:
            problems.append(f"{item}.{name}: in the checkpoint, not in the template")
        else:
            w, s = wanted[name], stored[name]
            if tuple(w.shape) != tuple(s.shape):
                problems.append(f"{item}.{name}: template shape {tuple(w.shape)}, stored {tuple(s.shape)}")
            elif np.dtype(w.dtype) != np.dtype(s.dtype):
                problems.append(
                    f"{item}.{name}: template dtype {np.dtype(w.dtype)}, stored {np.dtype(s.dtype)}"
                )
    return problems


def shape_dtype_tree(metadata_tree: Any) -> Any:
    """An orbax metadata tree as ``jax.ShapeDtypeStruct`` leaves (no values read); a leaf that
    is no array (a string in a caller's dataset state) stays the metadata orbax gives for it."""

    def is_array(m: Any) -> bool:
        return hasattr(m, "shape") and hasattr(m, "dtype")

    return jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), np.dtype(m.dtype)) if is_array(m) else m,
        metadata_tree,
        is_leaf=is_array,
    )


def default_sharding() -> jax.sharding.Sharding:
    """Where a template leaf without a sharding is placed: this process's first device."""
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def step_number(step: Any) -> int:
    """``step`` as an int, refusing anything but a non-negative integer."""
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ValueError(f"Checkpoints: step must be an int >= 0, got {step!r}")
    return int(step)


def check_step(step: int, state: TrainState) -> None:
    """A state is saved under the step it is at."""
    held = int(np.asarray(jax.device_get(state.step)))
    if held != step:
        raise ValueError(f"Checkpoints.save: step {step} but the state is at step {held}")


def abstract_leaf(leaf: Any) -> jax.ShapeDtypeStruct:
    """A leaf's shape, dtype and sharding (a template for restoring onto it)."""
    dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
    return jax.ShapeDtypeStruct(np.shape(leaf), dtype, sharding=getattr(leaf, "sharding", None))


# --- the EMA record a step keeps ------------------------------------------------------------------
#: In a step's EMA record: the law is a default assumed for a state that carried none and was
#: given none (``Checkpointer``), so ``restore_ema(decay=...)`` may replace it.
ASSUMED = "assumed"


def with_law(state: TrainState, record: Mapping[str, Any] | None) -> TrainState:
    """``state`` carrying an EMA law: its own, else the one ``record`` (``ema.record``) names
    (not an assumed default: that stays in the step's metadata)."""
    if state.ema_law is not None or record is None or record.get(ASSUMED):
        return state
    spec, k = ema_lib.from_record(dict(record))
    return state.replace(ema_law=ema_lib.law(spec, state.params, k))


def law_record(state: TrainState, record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON record kept in a step's metadata beside ``extra``'s law, describing that law
    (so the two never disagree); runs on the writer thread (it reads the law's values)."""
    if state.ema_law is None:
        return None if record is None else dict(record)
    spec, k = ema_lib.from_law(jax.device_get(state.ema_law), state.params)
    out = ema_lib.record(spec, state.params, k)
    if (
        record is not None
        and record.get(ASSUMED)
        and ema_lib.same_law(ema_lib.from_record(dict(record))[0], spec)
    ):
        out[ASSUMED] = True
    return out


# --- where a checkpoint directory is -------------------------------------------------------------
#: Remote schemes etils.epath serves, and the packages that can back each (any one will do:
#: etils uses TensorFlow's gfile when TensorFlow is installed, else fsspec's implementation).
REMOTE_SCHEMES: dict[str, tuple[str, ...]] = {
    "gs": ("gcsfs", "tensorflow"),
    "s3": ("s3fs", "tensorflow"),
    "az": ("adlfs", "tensorflow"),
    "hf": ("huggingface_hub",),
}


class DirectoryError(ValueError):
    """A checkpoint directory that cannot be used as given (bad URI, missing filesystem)."""


def scheme_of(text: str) -> str | None:
    """The URI scheme of ``text`` (``"gs"``), or None for a plain path."""
    if "://" not in text:
        return None
    return text.split("://", 1)[0].lower()


def directory(text: str | os.PathLike, what: str = "checkpoint directory") -> epath.Path:
    """``text`` as an ``epath.Path``: a plain path made absolute, ``file://`` as the local path
    it names, a remote URI as is when its filesystem package is installed.

    Raises ``DirectoryError`` naming the value, the scheme and what would be accepted.
    """
    raw = os.fspath(text)
    if not isinstance(raw, str) or not raw:
        raise DirectoryError(f"{what} {text!r} is invalid: expected a non-empty path or URI")
    scheme = scheme_of(raw)
    if scheme is None:
        return epath.Path(os.path.abspath(raw))
    if scheme == "file":
        parsed = urllib.parse.urlparse(raw)
        if parsed.netloc not in ("", "localhost"):
            raise DirectoryError(
                f"{what} {raw!r} names host {parsed.netloc!r}: a file:// URI must be file:///absolute/path"
            )
        return epath.Path(os.path.abspath(urllib.parse.unquote(parsed.path)))
    if scheme not in REMOTE_SCHEMES:
        known = ", ".join(f"{s}://" for s in ("file", *REMOTE_SCHEMES))
        raise DirectoryError(
            f"{what} {raw!r} has the URI scheme {scheme}://, which orbax's path handling (etils.epath) "
            f"does not serve: expected a local path or one of {known}"
        )
    packages = REMOTE_SCHEMES[scheme]
    if not any(importlib.util.find_spec(p) is not None for p in packages):
        raise DirectoryError(
            f"{what} {raw!r} is on {scheme}://, whose filesystem package is not installed: "
            f"install {' or '.join(packages)} to use it (nothing was written)"
        )
    return epath.Path(raw)


def is_local(path: epath.Path) -> bool:
    """Whether ``path`` is on this machine's file system (``os`` functions work on it)."""
    return scheme_of(os.fspath(path)) is None
