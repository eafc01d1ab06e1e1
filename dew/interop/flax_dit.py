"""The JAX references' flax DiT parameters -> dew's DiT parameters (haiku).

Gsunshine/meanflow (``models/models_dit.py``: DiT with the second time embedding ``h_embedder``)
and Lyy-iiis/imeanflow (``models/imfDiT.py``: the in-context DiT with u and v heads) are flax
``linen`` modules; their ``variables["params"]`` is a nested dict. A leaf at
``blocks/layers_3/attn/qkv/_flax_linear/kernel`` becomes module ``<top>/blocks_3/attn/qkv``,
parameter ``weight``:

- the wrappers ``_flax_linear`` / ``_flax_embedding`` (the references' ``TorchLinear`` /
  ``TorchEmbedding`` around ``nn.Dense`` / ``nn.Embed``) are dropped;
- ``nn.Sequential``'s ``layers_N`` is joined to the module before it (``mlp/layers_0`` ->
  ``mlp_0``, ``adaLN_modulation/layers_1`` -> ``adaLN_modulation_1``), as dew names the
  PyTorch ``.N`` indices (``dew.interop.dit_checkpoint``);
- leaves ``kernel`` (Dense [in, out], Conv HWIO, RMSNorm's scale) and ``embedding`` become
  ``weight``; other leaves (``bias``, the iMF blocks' ``attn_scale`` / ``mlp_scale``, its
  condition tokens) keep their names.

flax's layouts are dew's (Dense kernels [in, out], convolutions HWIO), so no array is transposed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

Params = dict[str, dict[str, np.ndarray]]
WRAPPERS = ("_flax_linear", "_flax_embedding")
LEAF_NAMES = {"kernel": "weight", "embedding": "weight"}
_SEQUENTIAL = re.compile(r"layers_(\d+)")


def _flatten(tree: Mapping, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], np.ndarray]:
    out: dict[tuple[str, ...], np.ndarray] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, (*prefix, str(key))))
        else:
            out[(*prefix, str(key))] = np.asarray(value)
    return out


def module_path(top: str, path: tuple[str, ...]) -> tuple[str, str]:
    """(haiku module, parameter name) of one flax leaf path (the module docstring's rules)."""
    *modules, leaf = path
    joined: list[str] = []
    for segment in modules:
        if segment in WRAPPERS:
            continue
        match = _SEQUENTIAL.fullmatch(segment)
        if match and joined:
            joined[-1] = f"{joined[-1]}_{match.group(1)}"
        else:
            joined.append(segment)
    return "/".join([top, *joined]), LEAF_NAMES.get(leaf, leaf)


def params_from_flax(flax_params: Mapping, top: str = "dit") -> Params:
    """dew's haiku parameters from a reference's ``variables["params"]`` (or the sub-tree of its
    network, e.g. ``variables["params"]["net"]``), float32; a ``ValueError`` when two flax leaves
    map to one dew parameter."""
    out: Params = {}
    for path, value in _flatten(flax_params).items():
        module, name = module_path(top, path)
        if name in out.setdefault(module, {}):
            raise ValueError(f"flax params: {'/'.join(path)} maps to {module}/{name}, which is already set")
        out[module][name] = value.astype(np.float32)
    return out


def check_against(params: Params, expected: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise ``ValueError`` naming the first parameter missing, extra or of another shape than the
    dew network's ``expected`` (e.g. ``jax.eval_shape`` of its ``init``)."""
    for module, leaves in expected.items():
        for name, leaf in leaves.items():
            got = params.get(module, {}).get(name)
            if got is None:
                raise ValueError(f"flax params: no value for {module}/{name}")
            if tuple(got.shape) != tuple(leaf.shape):
                raise ValueError(
                    f"flax params: {module}/{name} has shape {tuple(got.shape)}, expected {tuple(leaf.shape)}"
                )
    for module, leaves in params.items():
        for name in leaves:
            if name not in expected.get(module, {}):
                raise ValueError(f"flax params: {module}/{name} is not a parameter of the dew network")
