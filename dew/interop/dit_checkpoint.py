"""facebookresearch/DiT, willisma/SiT and sihyun-yu/REPA checkpoints -> dew's DiT parameters.

Reads the layouts the references publish and save: a plain ``state_dict`` (the published
``DiT-XL-2-256x256.pt`` / ``SiT-XL-2-256x256.pt``), or the dict their ``train.py`` saves
(``{"model", "ema", "opt", "args"}``; the ``ema`` weights are taken unless told, as their
``sample.py`` does), from a ``.pt`` (PyTorch's zip format, read by ``dew.interop.torch_zip``
without PyTorch and without executing anything it names) or from an ``.npz`` holding the same
keys (plain, or prefixed ``ema/`` / ``model/``; never unpickled).

A key ``blocks.3.attn.qkv.weight`` becomes module ``<top>/blocks_3/attn/qkv``, parameter
``weight`` (each ``.N`` index joined to the module before it); linear weights [out, in] -> [in, out],
the patch convolution OIHW -> HWIO; the fixed ``pos_embed`` buffer is checked against the 2-D
sin-cos table dew computes and dropped. The result is checked key by key against the shapes the
configured dew network (``dew.models[name](**options)`` at the checkpoint's latent size) creates:
a checkpoint of another size fails with one line naming the key, its shape and the expected one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import numpy as np

from dew.interop import torch_zip
from dew.interop.pickle_bounds import PickleRefused
from dew.npz import Member, NotAnNpzError, read_npz
from dew.schema import ConfigError

Params = dict[str, dict[str, np.ndarray]]
WHICH = ("ema", "model")
ROTARY_BUFFERS = ("feat_rope.", "module.feat_rope.")
"""LightningDiT's rotary tables (buffers; dew computes them from the grid: ``dit_layers.rotary_tables``)."""


class CheckpointError(ValueError):
    """A checkpoint that is not the configured network's; the message says which key and why."""


def read_checkpoint(path: str | os.PathLike, which: str = "ema") -> dict[str, np.ndarray]:
    """The float32 state dict in ``path`` (.pt/.pth or .npz); ``which`` picks ``ema`` or ``model``
    from a training checkpoint (a plain state dict is returned as it is)."""
    path = os.fspath(path)
    if which not in WHICH:
        raise ConfigError(f"which={which!r} is unknown: expected one of {WHICH}")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint: no file at {path!r}")
    if path.endswith(".npz"):
        try:  # numbers of any shape; each member's size checked before it is read
            read = read_npz(path, "checkpoint", {}, default=Member("fiu"))
        except NotAnNpzError as e:
            raise CheckpointError(str(e)) from None
        arrays = {k: v for k, v in read.items() if isinstance(v, np.ndarray)}
        prefixed = {k.split("/", 1)[0] for k in arrays if "/" in k}
        if prefixed & set(WHICH):
            if which not in prefixed:
                raise CheckpointError(f"checkpoint: {path} holds {sorted(prefixed)}, not {which!r}")
            arrays = {k[len(which) + 1 :]: v for k, v in arrays.items() if k.startswith(which + "/")}
        return {k: v.astype(np.float32) for k, v in arrays.items()}
    if path.endswith((".pt", ".pth")):
        try:
            loaded = torch_zip.read(path)  # no PyTorch, nothing executed (train.py's args are data)
        except PickleRefused as e:
            raise CheckpointError(f"checkpoint: {e}") from None
        if not isinstance(loaded, Mapping):
            raise CheckpointError(f"checkpoint: {path} holds a {type(loaded).__name__}, not a state dict")
        if "ema" in loaded or "model" in loaded:
            if which not in loaded:
                raise CheckpointError(f"checkpoint: {path} holds {sorted(loaded)}, not {which!r}")
            loaded = loaded[which]
        if not isinstance(loaded, Mapping) or not all(isinstance(v, np.ndarray) for v in loaded.values()):
            raise CheckpointError(f"checkpoint: {path} holds no state dict (a mapping of names to tensors)")
        return {str(k): np.asarray(v, np.float32) for k, v in loaded.items()}
    raise CheckpointError(f"checkpoint: {path!r} must end in .npz, .pt or .pth")


def module_path(top: str, key: str) -> tuple[str, str]:
    """(haiku module, parameter name) of a reference key: ``mlp.0.weight`` -> (``<top>/mlp_0``,
    ``weight``); a ``module.`` prefix (DistributedDataParallel's) is dropped."""
    parts = key.split(".")
    if parts[0] == "module":
        parts = parts[1:]
    merged: list[str] = []
    for part in parts[:-1]:
        if re.fullmatch(r"\d+", part) and merged:
            merged[-1] = f"{merged[-1]}_{part}"
        else:
            merged.append(part)
    return "/".join([top, *merged]), parts[-1]


def check_layout(state: Mapping[str, np.ndarray]) -> None:
    """Refuse, with ``CheckpointError`` naming the key, a state dict whose patch convolution
    ``x_embedder.proj.weight`` is not [D, C, p, p] with p >= 1 and D, C >= 1, or whose
    ``pos_embed`` is not [1, T, D] with T >= 1: what ``latent_size`` and ``convert`` read, checked
    before anything is built from them."""
    proj = state.get("x_embedder.proj.weight")
    if proj is None:
        raise CheckpointError("checkpoint: no 'x_embedder.proj.weight': not a DiT/SiT state dict")
    shape = tuple(np.shape(proj))
    if len(shape) != 4 or shape[2] != shape[3] or min(shape) < 1:
        raise CheckpointError(
            f"checkpoint: x_embedder.proj.weight has shape {shape}; expected the patch convolution "
            "[hidden, channels, p, p] with p >= 1"
        )
    pos = state.get("pos_embed")
    if pos is not None and (np.ndim(pos) != 3 or np.shape(pos)[0] != 1 or np.shape(pos)[1] < 1):
        raise CheckpointError(
            f"checkpoint: pos_embed has shape {np.shape(pos)}; expected [1, tokens, hidden]"
        )


def latent_size(state: Mapping[str, np.ndarray]) -> int | None:
    """The latent side the checkpoint was built for, from ``pos_embed`` [1, T, D] and the patch
    convolution [D, C, p, p] (None when either is missing)."""
    pos, proj = state.get("pos_embed"), state.get("x_embedder.proj.weight")
    if pos is None or proj is None:
        return None
    grid = round(float(np.sqrt(pos.shape[1])))
    return grid * int(proj.shape[-1])


def convert_state_dict(state: Mapping[str, np.ndarray], top: str = "dit") -> Params:
    """Reference keys -> dew's parameter tree (layouts only; ``convert`` also checks shapes)."""
    params: Params = {}
    for key, value in state.items():
        if key in ("pos_embed", "module.pos_embed") or key.startswith(ROTARY_BUFFERS):
            continue
        module, name = module_path(top, key)
        value = np.asarray(value, np.float32)
        if name == "weight" and value.ndim == 4:
            value = value.transpose(2, 3, 1, 0)
        elif name == "weight" and value.ndim == 2 and not module.endswith("embedding_table"):
            value = value.T
        params.setdefault(module, {})[name] = np.ascontiguousarray(value)
    return params


def expected_shapes(
    model: str, options: Mapping | None, input_size: int, in_channels: int, top: str = "dit"
) -> dict[str, dict[str, tuple[int, ...]]]:
    """The parameter shapes ``dew.models[model](**options)`` creates on [1, size, size, C] latents."""
    import haiku as hk
    import jax
    import jax.numpy as jnp

    from dew import registry

    options = dict(options or {})
    takes_h = "h" in tuple(options.get("time_inputs", ("t",)))

    def init(x, t, y):
        net = registry.models[model](name=top, **options)
        return net(x, t, y, h=t if takes_h else None)

    shapes = jax.eval_shape(
        hk.transform(init).init,
        jax.random.PRNGKey(0),
        jnp.zeros((1, input_size, input_size, in_channels)),
        jnp.zeros((1,)),
        jnp.zeros((1,), jnp.int32),
    )
    return {m: {n: tuple(a.shape) for n, a in leaves.items()} for m, leaves in shapes.items()}


def convert(
    state: Mapping[str, np.ndarray],
    model: str = "DiT-XL/2",
    options: Mapping | None = None,
    *,
    input_size: int | None = None,
    top: str = "dit",
) -> Params:
    """``state`` (a reference state dict) -> parameters of ``dew.models[model](**options)``.

    ``input_size`` (the latent side) defaults to the checkpoint's own (``pos_embed``); a patch
    size that does not divide it raises ``ConfigError``; a key, shape or count that the network
    does not have raises ``CheckpointError`` naming the key, the shapes and what was expected.
    """
    from dew.networks.dit_layers import get_2d_sincos_pos_embed

    check_layout(state)
    proj = state["x_embedder.proj.weight"]
    hidden, in_channels, patch = int(proj.shape[0]), int(proj.shape[1]), int(proj.shape[-1])
    size = input_size if input_size is not None else latent_size(state)
    if size is None:
        raise ConfigError("input_size=None: the checkpoint has no pos_embed; pass the latent side")
    if size % patch:
        raise ConfigError(
            f"input_size={size}: the checkpoint's patch size {patch} does not divide it; "
            "expected a latent side that is a multiple of the patch size"
        )
    if "pos_embed" in state:
        grid = size // patch
        table = get_2d_sincos_pos_embed(hidden, grid).astype(np.float32)[None]
        stored = np.asarray(state["pos_embed"], np.float32)
        if stored.shape != table.shape:
            raise CheckpointError(
                f"checkpoint: pos_embed has shape {stored.shape}, expected {table.shape} "
                f"(a {grid}x{grid} grid of width {hidden})"
            )
        if not np.allclose(stored, table, atol=1e-6, rtol=0):
            raise CheckpointError("checkpoint: pos_embed is not the fixed 2-D sin-cos table DiT builds")
    params = convert_state_dict(state, top)
    expected = expected_shapes(model, options, size, in_channels, top)
    for module, leaves in params.items():
        for name, value in leaves.items():
            key = _reference_key(top, module, name)
            want = expected.get(module, {}).get(name)
            if want is None:
                raise CheckpointError(
                    f"checkpoint: {key} {tuple(value.shape)} is not in {model} with {options or {}}"
                )
            if tuple(value.shape) != want:
                raise CheckpointError(
                    f"checkpoint: {key} has shape {_torch_shape(value.shape, key)}, {model} with "
                    f"{options or {}} expects {_torch_shape(want, key)}"
                )
    for module, leaves in expected.items():
        for name, want in leaves.items():
            if name not in params.get(module, {}):
                key = _reference_key(top, module, name)
                raise CheckpointError(
                    f"checkpoint: {key} (shape {_torch_shape(want, key)}) is missing for {model} "
                    f"with {options or {}}"
                )
    return params


def _reference_key(top: str, module: str, name: str) -> str:
    parts = module[len(top) + 1 :].split("/")
    return ".".join(re.sub(r"_(\d+)", r".\1", p) if re.search(r"_\d+$", p) else p for p in parts) + f".{name}"


def _torch_shape(shape: tuple[int, ...], key: str) -> tuple[int, ...]:
    """A dew shape written in the reference's layout (for messages)."""
    shape = tuple(shape)
    if key.endswith(".weight") and len(shape) == 4:
        return (shape[3], shape[2], shape[0], shape[1])
    if key.endswith(".weight") and len(shape) == 2 and "embedding_table" not in key:
        return shape[::-1]
    return shape
