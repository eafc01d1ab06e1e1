"""``config.objective.repa``: REPA's settings (sihyun-yu/REPA ``train.py``), checked against the
network and the data before the frozen encoder's weights are read once, on the host
(``repa_from_config``). The ``interpolant`` objective composes the result (``dew.objectives.repa``)."""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp

from dew.inputs import Field
from dew.objectives.repa import Repa
from dew.schema import ConfigError, Key, Section, at_least

CONFIG_REPA = Section(
    "REPA's representation alignment (None encoder: off)",
    {
        "encoder": Key(
            None,
            "a registered representation encoder (dinov2-vit-b: REPA's; image_encoder: dew's own)",
            kind=str,
        ),
        "encoder_weights": Key(None, "the encoder's converted .npz (None: its default path)", kind=str),
        "allow_unpinned": Key(False, "accept encoder weights whose source digest is not pinned"),
        "image_field": Key(None, "the batch field the encoder sees (None: the sample)", kind=str),
        "value_range": Key(
            None,
            "(low, high) of that field (None: (-1, 1) for the sample, (0, 255) for raw images)",
            kind=tuple,
        ),
        "resolution": Key(None, "the side REPA's resize rule reads (None: the images')", kind=int),
        "encoder_depth": Key(8, "the block whose tokens are projected", **at_least(1, "an int >= 1")),
        "proj_coeff": Key(0.5, "the alignment loss's weight", **at_least(0, "a float >= 0")),
        "projector_dim": Key(2048, "the projector MLP's hidden width", **at_least(1, "an int >= 1")),
    },
)


def validate_repa(section: Any) -> None:
    """The section's own checks (those that need no network or data)."""
    if section.encoder is not None:
        _repa_encoder(section.encoder)
    if section.value_range is not None and len(section.value_range) != 2:
        raise ConfigError(
            f"config.objective.repa.value_range={section.value_range!r} is invalid: expected (low, high)"
        )


def _network_depth(model: Any) -> int | None:
    """The ``depth`` a network factory builds with (its keyword, or its signature's default)."""
    try:
        parameter = inspect.signature(model).parameters.get("depth")
    except (TypeError, ValueError):
        return None
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _repa_encoder(name: str):
    from dew.objectives.repa_encoders import representation_encoder, representation_encoders

    try:
        return representation_encoder(name)
    except KeyError:
        raise ConfigError(
            f"config.objective.repa.encoder={name!r} is unknown: expected one of {representation_encoders()}"
        ) from None


def repa_from_config(section: Any, model: Any, source: Any, sample: Field, model_name: str) -> Repa:
    """REPA's settings from ``config.objective.repa``: the encoder checked against the network
    (its depth, its token count) before its weights are read once, on the host."""
    encoder = _repa_encoder(section.encoder)
    signature_ok = "encoder_depth" in getattr(_safe_signature(model), "parameters", {})
    if not signature_ok:
        raise ConfigError(
            f"config.model.name={model_name!r} cannot be aligned by REPA: expected a network built with "
            "encoder_depth and projector_dims (the DiT / SiT networks)"
        )
    depth = _network_depth(model)
    if depth is not None and not 1 <= section.encoder_depth <= depth:
        raise ConfigError(
            f"config.objective.repa.encoder_depth={section.encoder_depth} is beyond the network: "
            f"expected 1..{depth} (config.model depth={depth})"
        )
    field = section.image_field or sample.name
    if field not in source.fields:
        raise ConfigError(
            f"config.objective.repa.image_field={field!r} is not a field of {source.name}: "
            f"expected one of {sorted(source.fields)}"
        )
    image_shape = tuple(source.fields[field].shape[1:])
    try:
        num_tokens = encoder.num_tokens(image_shape)
    except ValueError as e:
        raise ConfigError(f"config.objective.repa.encoder={section.encoder!r}: {e}") from None
    patch = inspect.signature(model).parameters.get("patch_size")
    patch = None if patch is None else patch.default
    if patch and len(sample.shape) == 3 and sample.shape[0] % patch == 0:
        tokens = (sample.shape[0] // patch) * (sample.shape[1] // patch)
        if tokens != num_tokens:
            raise ConfigError(
                f"config.objective.repa.encoder={section.encoder!r} gives {num_tokens} tokens for "
                f"{field} {image_shape} but the network has {tokens} ({sample.shape[0]}x{sample.shape[1]} "
                f"at patch {patch}): REPA matches tokens one to one (no interpolation); expected an "
                "encoder, image size or patch size with equal token counts"
            )
    value_range = section.value_range
    if value_range is None:
        value_range = (-1.0, 1.0) if field == sample.name else (0.0, 255.0)
    params = encoder.load(
        section.encoder_weights,
        allow_unpinned=section.allow_unpinned,
        resolution=section.resolution or image_shape[0],
    )
    probe = jax.ShapeDtypeStruct((1, *image_shape), jnp.float32)
    shape = jax.eval_shape(
        lambda p, x: encoder.tokens(p, x, tuple(value_range), section.resolution), params, probe
    ).shape
    return Repa(
        encoder,
        params,
        embed_dim=int(shape[-1]),
        num_tokens=int(shape[1]),
        image_field=field,
        value_range=(float(value_range[0]), float(value_range[1])),
        resolution=section.resolution,
        encoder_depth=section.encoder_depth,
        proj_coeff=float(section.proj_coeff),
        projector_dim=section.projector_dim,
    )


def _safe_signature(model: Any):
    try:
        return inspect.signature(model)
    except (TypeError, ValueError):
        return None
