"""NVlabs/edm2 ``Precond``/``UNet`` state dicts <-> dew parameters, on numpy arrays (no PyTorch,
no JAX needed).

The mapping is one to one, by name, and a transposition per weight:

* ``unet.enc.<R>x<R>_<block>.<layer>.weight`` (and ``dec``) -> module
  ``<top>/unet/enc_<R>x<R>_<block>/<layer>``, parameter ``weight``; convolutions OIHW -> HWIO;
* ``unet.enc.<R>x<R>_conv.weight``, ``unet.out_conv.weight`` -> ``<top>/unet/enc_<R>x<R>_conv``,
  ``<top>/unet/out_conv``: OIHW -> HWIO;
* ``unet.emb_noise.weight``, ``unet.emb_label.weight``, ``*.emb_linear.weight``,
  ``logvar_linear.weight`` -> the same path with ``/``: [out, in] -> [in, out];
* ``unet.enc.<R>x<R>_<block>.emb_gain`` -> ``<top>/unet/enc_<R>x<R>_<block>``, ``emb_gain``;
  ``unet.out_gain`` -> ``<top>/unet``, ``out_gain`` (scalars);
* buffers ``unet.emb_fourier.freqs``/``phases``, ``logvar_fourier.freqs``/``phases`` ->
  ``<top>/unet/emb_fourier``, ``<top>/logvar_fourier`` ([C], gradient stopped in dew).

``<top>`` is ``edm2`` (``dew.models["edm2"]``, the ``Precond``). For a bare ``UNet`` state dict
(no ``unet.`` prefix) pass ``top="edm2unet"`` and ``prefix=""``. The attention ``qkv`` channel
order is the reference's own (head, channel, q|k|v): dew's ``Block`` reshapes it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

Params = dict[str, dict[str, np.ndarray]]


def dew_name(key: str, top: str = "edm2", prefix: str = "") -> tuple[str, str]:
    """(haiku module path, parameter name) of reference state_dict ``key`` (``prefix`` is
    prepended to the key first, e.g. ``"unet."`` to name a bare UNet's keys inside a Precond)."""
    *modules, param = (prefix + key).split(".")
    path, i = [top], 0
    while i < len(modules):
        if modules[i] in ("enc", "dec"):
            if i + 1 >= len(modules):
                raise ValueError(f"state_dict key {key!r}: '{modules[i]}' is not followed by a block name")
            path.append(f"{modules[i]}_{modules[i + 1]}")
            i += 2
        else:
            path.append(modules[i])
            i += 1
    return "/".join(path), param


def to_dew_layout(value: np.ndarray) -> np.ndarray:
    """OIHW -> HWIO for convolutions, [out, in] -> [in, out] for linear layers, else unchanged."""
    if value.ndim == 4:
        return value.transpose(2, 3, 1, 0)
    if value.ndim == 2:
        return value.T
    return value


def to_reference_layout(value: np.ndarray) -> np.ndarray:
    """The inverse of ``to_dew_layout``."""
    if value.ndim == 4:
        return value.transpose(3, 2, 0, 1)
    if value.ndim == 2:
        return value.T
    return value


def convert_state_dict(state: Mapping[str, np.ndarray], top: str = "edm2", prefix: str = "") -> Params:
    """A reference state dict (name -> array) as dew haiku parameters (float32)."""
    params: Params = {}
    for key, value in state.items():
        module, param = dew_name(key, top, prefix)
        leaves = params.setdefault(module, {})
        if param in leaves:
            raise ValueError(f"state_dict key {key!r} maps to {module}/{param}, which is already set")
        leaves[param] = np.array(to_dew_layout(np.asarray(value, np.float32)), order="C")
    return params


def check_against(params: Params, expected: Mapping[str, Mapping[str, tuple]]) -> None:
    """Raise ValueError naming the first module/parameter whose presence or shape differs from
    ``expected`` (module -> parameter -> shape, e.g. from ``jax.eval_shape`` of the network's init)."""
    for module in sorted(set(params) | set(expected)):
        got, want = params.get(module, {}), expected.get(module, {})
        for name in sorted(set(got) | set(want)):
            if name not in got or name not in want:
                side = "the reference" if name in got else "dew"
                raise ValueError(f"{module}/{name} exists only in {side}")
            if tuple(got[name].shape) != tuple(want[name]):
                raise ValueError(
                    f"{module}/{name}: reference shape {tuple(got[name].shape)} (dew layout), "
                    f"dew {want[name]}"
                )
