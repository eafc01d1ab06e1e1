"""An NVlabs/edm snapshot's network (``EDMPrecond`` around ``SongUNet`` / ``DhariwalUNet``) as the
dew config that builds the same denoiser: ``config.model`` (``songunet`` / ``dhariwalunet`` with
every constructor argument) and the ``config.objective`` keys it fixes (the ``EDM`` preset, the
conditioning, EDM's ``label_dropout`` as ``condition_dropout``).

What dew cannot express is refused with one line naming it (``UnsupportedNetwork``): another
preconditioning (``VPPrecond``, ``VEPrecond``, ``iDDPMPrecond``), a ``sigma_data`` or a loss other
than the ``EDM`` preset's, a noise range narrower than the preset samples, an unknown argument.
``use_fp16`` is recorded, not reproduced: dew evaluates the network in float32 (the reference
does too, off CUDA).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.interop.edm_pickle import EDMSnapshot, NotAnEDMNetwork, PickledModule


class UnsupportedNetwork(ValueError):
    """An EDM network dew has no exact equivalent for; the message says which setting."""


DEW_MODELS = {"SongUNet": "songunet", "DhariwalUNet": "dhariwalunet"}
"""Reference network class -> dew model name."""

REFERENCE_DEFAULTS: dict[str, dict[str, Any]] = {
    "SongUNet": {
        "augment_dim": 0,
        "model_channels": 128,
        "channel_mult": (1, 2, 2, 2),
        "channel_mult_emb": 4,
        "num_blocks": 4,
        "attn_resolutions": (16,),
        "dropout": 0.10,
        "label_dropout": 0.0,
        "embedding_type": "positional",
        "channel_mult_noise": 1,
        "encoder_type": "standard",
        "decoder_type": "standard",
        "resample_filter": (1, 1),
    },
    "DhariwalUNet": {
        "augment_dim": 0,
        "model_channels": 192,
        "channel_mult": (1, 2, 3, 4),
        "channel_mult_emb": 4,
        "num_blocks": 3,
        "attn_resolutions": (32, 16, 8),
        "dropout": 0.10,
        "label_dropout": 0.0,
    },
}
"""The constructor defaults of ``training/networks.py`` at the pinned commit (what an argument the
pickle does not record was), less the interface arguments ``EDMPrecond`` always passes."""

INTERFACE = ("img_resolution", "in_channels", "out_channels", "label_dim")


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """``model``: ``config.model``; ``objective``: the ``config.objective`` keys it sets;
    ``image_shape`` (H, W, C) and ``label_dim`` the data must have; ``details``: JSON record of the
    pickle for ``run.json``."""

    model: dict[str, Any]
    objective: dict[str, Any]
    image_shape: tuple[int, int, int]
    label_dim: int
    details: dict[str, Any]


def jsonable(value: Any) -> Any:
    """``value`` with tuples as lists, numpy scalars as Python numbers, non-finite floats as strings."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _plain(value: Any) -> Any:
    """A constructor argument as a config value: lists as tuples, numpy scalars as Python's."""
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _shown(value: Any) -> str:
    """``repr(value)`` cut to a length a one-line message can carry."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(obj: PickledModule, name: str) -> float:
    value = obj.state.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise NotAnEDMNetwork(f"{obj.class_name}.{name} is {_shown(value)}, not a number")
    return float(value)


def network_config(snapshot: EDMSnapshot) -> NetworkConfig:
    """The dew config of ``snapshot``'s network; raises ``UnsupportedNetwork`` / ``NotAnEDMNetwork``."""
    from dew.diffusion.process import EDM

    net = snapshot.network
    if net.class_name != "EDMPrecond":
        raise UnsupportedNetwork(
            f"the network is a {net.class_name}: dew converts EDMPrecond networks (EDM preconditioning); "
            "VPPrecond, VEPrecond and iDDPMPrecond are not mapped"
        )
    inner = net.children().get("model")
    if inner is None or inner.class_name not in DEW_MODELS:
        found = None if inner is None else inner.class_name
        raise UnsupportedNetwork(
            f"EDMPrecond.model is {found!r}: expected one of {sorted(DEW_MODELS)} (dew's "
            f"{', '.join(sorted(DEW_MODELS.values()))})"
        )
    resolution, channels, label_dim = (
        int(_number(net, k)) for k in ("img_resolution", "img_channels", "label_dim")
    )
    sigma_data, sigma_min, sigma_max = (_number(net, k) for k in ("sigma_data", "sigma_min", "sigma_max"))
    if sigma_data != EDM.sigma_data:
        raise UnsupportedNetwork(
            f"EDMPrecond.sigma_data={sigma_data}: dew's EDM preset has sigma_data={EDM.sigma_data}"
        )
    if not (sigma_min <= EDM.sigma_min and sigma_max >= EDM.sigma_max):
        raise UnsupportedNetwork(
            f"EDMPrecond supports σ in [{sigma_min}, {sigma_max}], narrower than the EDM preset's "
            f"sampling range [{EDM.sigma_min}, {EDM.sigma_max}]"
        )
    loss = snapshot.loss
    if loss is not None:
        found = (loss.class_name, *(_number(loss, k) for k in ("P_mean", "P_std", "sigma_data")))
        expected = ("EDMLoss", EDM.p_mean, EDM.p_std, EDM.sigma_data)
        if found != expected:
            raise UnsupportedNetwork(
                f"loss_fn is {found[0]}(P_mean, P_std, sigma_data = {found[1:]}): dew's EDM preset "
                f"trains with EDMLoss{expected[1:]}"
            )

    kwargs = inner.init_kwargs
    arch = inner.class_name
    unknown = sorted(set(kwargs) - set(REFERENCE_DEFAULTS[arch]) - set(INTERFACE))
    if unknown:
        raise UnsupportedNetwork(f"{arch} argument(s) {unknown} have no dew equivalent")
    expected_interface = {"img_resolution": resolution, "in_channels": channels, "out_channels": channels}
    for key, value in expected_interface.items():
        if key in kwargs and kwargs[key] != value:
            raise NotAnEDMNetwork(f"{arch}.{key}={_shown(kwargs[key])} but EDMPrecond has {value}")
    if kwargs.get("label_dim", label_dim) != label_dim:
        found = _shown(kwargs["label_dim"])
        raise NotAnEDMNetwork(f"{arch}.label_dim={found} but EDMPrecond has {label_dim}")
    arguments = {k: _plain(kwargs.get(k, default)) for k, default in REFERENCE_DEFAULTS[arch].items()}
    label_dropout = float(arguments.pop("label_dropout"))
    # label_dim stays dew's None (the width of the label the objective passes): check_data makes
    # that the data set's class count, and condition "none" passes no label (no map_label).
    model = {"name": DEW_MODELS[arch], **arguments}
    objective = {
        "name": "diffusion",
        "preset": "EDM",
        "condition": "class_label" if label_dim else "none",
        "condition_dropout": label_dropout,
    }
    details = {
        "network": net.class_name,
        "model_type": arch,
        "init_kwargs": jsonable(net.init_kwargs),
        "model_init_kwargs": jsonable(kwargs),
        "use_fp16": bool(net.state.get("use_fp16", False)),
        "module_sha256": net.module_sha256,
        "loss": None
        if loss is None
        else {"class_name": loss.class_name, "init_kwargs": jsonable(loss.init_kwargs)},
        "augment_pipe": None
        if snapshot.augment_pipe is None
        else {
            "class_name": snapshot.augment_pipe.class_name,
            "init_kwargs": jsonable(snapshot.augment_pipe.init_kwargs),
        },
        "dataset_kwargs": jsonable(snapshot.dataset_kwargs),
    }
    return NetworkConfig(model, objective, (resolution, resolution, channels), label_dim, details)


def check_data(source: Any, network: NetworkConfig, dataset_name: str) -> None:
    """The data set ``source`` (a ``dew.data.Source``) has the network's image shape and classes."""
    image = source.fields.get(source.sample_field)
    shape = None if image is None else tuple(int(n) for n in image.shape[1:])
    classes = source.num_classes or 0
    if shape != network.image_shape or (network.label_dim and classes != network.label_dim):
        h, w, c = network.image_shape
        have = "no images" if shape is None else "x".join(map(str, shape)) + " images"
        raise UnsupportedNetwork(
            f"config.dataset.name={dataset_name!r} gives {have} with {classes} classes; the pickle's network "
            f"takes {h}x{w}x{c} images with {network.label_dim or 'any number of'} classes: name the data it "
            "was trained on (--config=<its experiment> or --config.dataset.name=...)"
        )
