"""NVlabs/edm state dicts <-> dew parameters, on numpy arrays (no PyTorch, no JAX needed).

A reference key ``model.enc.16x16_block0.conv0.weight`` becomes haiku module
``<top>/enc_16x16_block0/conv0``, parameter ``weight``. Layouts change as dew's layers expect:
convolution weights OIHW -> HWIO, linear weights [out, in] -> [in, out], and the attention
``qkv`` output channels from the reference's (head, channel, q|k|v) interleaving to dew's
(q|k|v, head, channel). ``resample_filter`` buffers are dropped (the network's
``resample_filter`` argument rebuilds them; ``convert_state_dict`` checks they agree).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dew.npz import open_npz

ARCHITECTURES = {"songunet": None, "dhariwalunet": 64}
"""dew model name -> channels per attention head (None: one head per block, as SongUNet)."""

BUFFERS = ("freqs",)
"""Parameter names that are fixed buffers in the reference (gradient stopped in dew)."""

Params = dict[str, dict[str, np.ndarray]]


def qkv_permutation(channels: int, num_heads: int) -> np.ndarray:
    """Index array p with dew_rows = reference_rows[p] for a qkv output of 3·channels rows."""
    dh = channels // num_heads
    j, h, c = np.meshgrid(np.arange(3), np.arange(num_heads), np.arange(dh), indexing="ij")
    return (h * 3 * dh + c * 3 + j).reshape(-1)


def _heads(arch: str, channels: int) -> int:
    per_head = ARCHITECTURES[arch]
    return 1 if per_head is None else channels // per_head


def _module_path(top: str, parts: list[str]) -> str:
    if parts[0] in ("enc", "dec"):
        parts = [f"{parts[0]}_{parts[1]}", *parts[2:]]
    return "/".join([top, *parts])


def convert_state_dict(
    state: Mapping[str, np.ndarray], arch: str, resample_filter=(1, 1), top: str | None = None
) -> Params:
    """A reference (``EDMPrecond`` or bare network) state dict -> dew's haiku params for ``arch``.

    ``arch`` is ``songunet`` or ``dhariwalunet``; ``top`` the haiku name of the network module
    (default: ``arch``, the networks' default name). Raises ValueError naming a key whose shape
    or resampling filter does not fit.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch={arch!r} is unknown: expected one of {sorted(ARCHITECTURES)}")
    top = top or arch
    f = np.asarray(resample_filter, np.float32)
    expected_filter = np.outer(f, f) / f.sum() ** 2
    params: Params = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "model":
            parts = parts[1:]
        value = np.asarray(value, np.float32)
        *module, name = parts
        if not module:
            raise ValueError(f"state dict key {key!r} names no module")
        if name == "resample_filter":
            stored = value.reshape(value.shape[-2:])
            if stored.shape != expected_filter.shape or not np.allclose(stored, expected_filter, atol=1e-7):
                raise ValueError(
                    f"{key}: the reference used resample filter {stored.tolist()}, but "
                    f"resample_filter={list(resample_filter)} builds {expected_filter.tolist()}"
                )
            continue
        if name == "weight" and value.ndim == 4:
            if module[-1] == "qkv":
                value = value[qkv_permutation(value.shape[0] // 3, _heads(arch, value.shape[0] // 3))]
            value = value.transpose(2, 3, 1, 0)
        elif name == "weight" and value.ndim == 2:
            value = value.T
        elif name == "bias" and module[-1] == "qkv":
            value = value[qkv_permutation(value.shape[0] // 3, _heads(arch, value.shape[0] // 3))]
        elif value.ndim not in (1,):
            raise ValueError(f"state dict key {key!r} has an unexpected shape {value.shape}")
        params.setdefault(_module_path(top, module), {})[name] = np.ascontiguousarray(value)
    return params


def count_parameters(params: Mapping[str, Mapping[str, np.typing.ArrayLike]]) -> int:
    """Trainable parameters (the reference's ``sum(p.numel() for p in net.parameters())``); any
    leaf with a ``.size`` (arrays, ``jax.ShapeDtypeStruct``) counts."""
    return sum(int(np.size(v)) for m in params.values() for k, v in m.items() if k not in BUFFERS)


def load_npz_state_dict(path: str, prefix: str = "param/", what: str = "state dict") -> dict[str, np.ndarray]:
    """The ``param/<key>`` arrays of an .npz export, as float32 (no pickle is read); a file that
    is no .npz raises ``dew.npz.NotAnNpzError`` (a ``ValueError``) naming ``what`` and the file."""
    with open_npz(path, what) as data:
        return {k[len(prefix) :]: data[k].astype(np.float32) for k in data.files if k.startswith(prefix)}
