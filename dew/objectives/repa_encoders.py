"""Frozen image encoders whose patch tokens REPA aligns a network's hidden states to
(Yu et al. 2025, sihyun-yu/REPA ``utils.py`` ``load_encoders`` and ``train.py``
``preprocess_raw_image``). Each is a ``RepresentationEncoder`` registered in
``dew.registry.encoders`` under its REPA name:

- ``dinov2-vit-b`` (REPA's default ``--enc-type``) and ``dinov2-vit-l``: facebookresearch/dinov2's
  ViT-B/14 and ViT-L/14 (``dew.scoring.dinov2``) as REPA
  loads it: the head removed and the learned 37×37 position grid resampled once, at load time,
  to 16·(resolution // 256) per side with timm's ``resample_abs_pos_embed`` (bicubic,
  antialiased); its tokens are ``x_norm_patchtokens`` (the final LayerNorm's patch tokens) of
  the image preprocessed as ``preprocess_raw_image``: x / 255, ImageNet mean/std, then
  ``F.interpolate(x, 224·(resolution // 256), mode='bicubic')`` (no antialias) — 256 tokens at
  256² and 1,024 at 512². Weights: the converted ``.npz`` of ``dew.scoring.dinov2_weights``
  (ViT-L) / ``dew.scoring.dinov2_vitb14_weights`` (ViT-B), digests checked.
- ``image_encoder``: dew's own contrastive encoder (``dew.objectives.contrastive``'s
  ``ImageEncoder``, e.g. ``experiments/probe.py``'s run), for small runs: its tokens are the
  last convolution's feature map (two stride-2 convolutions: (H/4)·(W/4) tokens of 2·width
  channels, post-ReLU), the spatial representation its pooled features are made from; the
  images enter as that run trained on them (the [−1, 1] scale). Weights: a ``.npz`` of the
  run's parameters that ``experiments/repa_digits.py export`` writes (``dew.pinned_weights``
  layout: haiku ``module/name`` keys, content digest checked).

An encoder is loaded once, on the host (``load``), and then used as a pure function
(``tokens(params, images)`` [B, T, D]) inside the jitted training step.

Precision: ``tokens(..., compute_dtype=...)`` runs the encoder in the run's compute dtype
(``config.precision.compute``, bfloat16 under the bfloat16 policy): the preprocessing (the
value range, DINOv2's ImageNet normalisation and resize) is float32, then the network computes
on its float32 weights cast at use (``dew.contracts.precision.cast_floats``: the loaded weights
stay float32 in memory, as on disk) and its tokens return as float32, where REPA's alignment
loss is computed. Under float32 the program is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.contracts.precision import cast_floats

Params = Any


@dataclasses.dataclass(frozen=True)
class RepresentationEncoder:
    """A frozen encoder REPA aligns to.

    ``embed_dim`` is the token width (None: read from the loaded weights);
    ``load(path, allow_unpinned, resolution)`` reads its weights (host, once; ``path`` None: the
    encoder's default file); ``tokens(params, images, value_range, resolution, compute_dtype)``
    maps images [B, H, W, C] in ``value_range`` to float32 patch tokens [B, T, embed_dim] (pure,
    jittable; ``resolution`` is the side REPA's rules read, the images' own by default;
    ``compute_dtype`` the dtype the network computes in, float32 by default: module
    docstring); ``num_tokens(image_shape)`` is T for
    images of shape [H, W, C] (raises ``ValueError`` for a shape the encoder cannot take).
    """

    name: str
    embed_dim: int | None
    load: Callable[..., Params]
    tokens: Callable[..., jax.Array]
    num_tokens: Callable[[tuple[int, ...]], int]


# --- DINOv2 as REPA uses it ---------------------------------------------------------------------------


def _dinov2_config(size: str):
    from dew.scoring import dinov2

    return dinov2.VIT_CONFIGS[size]


def repa_resolution(image_side: int) -> int:
    """The side REPA resizes to for DINOv2: 224·(resolution // 256), resolution ∈ {256, 512}
    (``load_encoders`` asserts it), so the patch grid is 16·(resolution // 256)."""
    if image_side not in (256, 512):
        raise ValueError(
            "REPA's DINOv2 encoders take 256x256 or 512x512 images (load_encoders asserts it), "
            f"got {image_side}"
        )
    return 224 * (image_side // 256)


def _dinov2_num_tokens(image_shape: tuple[int, ...]) -> int:
    h, w = image_shape[:2]
    if h != w:
        raise ValueError(f"REPA's DINOv2 encoders take square images, got {h}x{w}")
    return (repa_resolution(h) // 14) ** 2


def _dinov2_load(size: str, path: str | None = None, *, allow_unpinned: bool = False, resolution: int = 256):
    from dew.scoring import dinov2_repa

    config = _dinov2_config(size)
    if size == "vitl14":
        from dew.scoring import dinov2_weights as weights
    else:
        from dew.scoring import dinov2_vitb14_weights as weights
    params = weights.load_weights(path, allow_unpinned=allow_unpinned, config=config)
    return dinov2_repa.resample_position_embeddings(params, config, repa_resolution(resolution) // 14)


def dinov2_tokens(
    config: Any,
    params: Params,
    images: jax.Array,
    value_range: tuple[float, float] = (0.0, 255.0),
    resolution: int | None = None,
    compute_dtype: Any = "float32",
) -> jax.Array:
    """REPA's DINOv2 tokens: ``preprocess_raw_image`` (float32) then ``x_norm_patchtokens`` of
    the ViT ``config`` (a ``dew.scoring.dinov2.ViTConfig`` or its name, ``vitb14``/``vitl14``)
    whose params came from ``load`` (position grid already resampled), computed in
    ``compute_dtype`` on the params cast at use: [B, (side/14)², embed_dim] float32."""
    from dew.scoring import dinov2, dinov2_repa

    if isinstance(config, str):
        config = _dinov2_config(config)
    side = repa_resolution(resolution or images.shape[1])
    dtype = jnp.dtype(compute_dtype)
    x = cast_floats(dinov2_repa.repa_preprocess(images, side, value_range), dtype)
    network = dinov2.network(dinov2_repa.repa_config(config, side // 14), "patch")
    return network.apply(cast_floats(params, dtype), x).astype(jnp.float32)


for _name, _size, _dim in (("dinov2-vit-b", "vitb14", 768), ("dinov2-vit-l", "vitl14", 1024)):
    registry.encoders.register(
        _name,
        RepresentationEncoder(
            _name,
            _dim,
            functools.partial(_dinov2_load, _size),
            functools.partial(dinov2_tokens, _size),
            _dinov2_num_tokens,
        ),
    )


# --- dew's own contrastive encoder ------------------------------------------------------------------


def _conv(x: jax.Array, p: dict[str, jax.Array], stride: int) -> jax.Array:
    """haiku ``Conv2D(kernel 3, stride, padding SAME)`` with its ``w`` [3, 3, in, out], ``b``."""
    y = jax.lax.conv_general_dilated(
        x, p["w"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return y + p["b"]


def image_encoder_tokens(
    params: Params,
    images: jax.Array,
    value_range: tuple[float, float] = (-1.0, 1.0),
    resolution: int | None = None,
    compute_dtype: Any = "float32",
) -> jax.Array:
    """``ImageEncoder``'s conv stack (``conv0``, stride-2 ``conv1``, ``conv2``, each ReLU) on
    images mapped to [−1, 1] (float32), computed in ``compute_dtype`` on the params cast at
    use: [B, (H/4)·(W/4), 2·width] float32."""
    del resolution
    lo, hi = value_range
    x = images.astype(jnp.float32)
    if (lo, hi) != (-1.0, 1.0):
        x = (x - lo) * (2.0 / (hi - lo)) - 1.0
    dtype = jnp.dtype(compute_dtype)
    x, p = cast_floats(x, dtype), cast_floats(params, dtype)
    h = jax.nn.relu(_conv(x, p["image_encoder/conv0"], 1))
    h = jax.nn.relu(_conv(h, p["image_encoder/conv1"], 2))
    h = jax.nn.relu(_conv(h, p["image_encoder/conv2"], 2))
    return h.reshape(h.shape[0], -1, h.shape[-1]).astype(jnp.float32)


def _image_encoder_num_tokens(image_shape: tuple[int, ...]) -> int:
    def halved_twice(n: int) -> int:  # two SAME-padded stride-2 convolutions: ceil(ceil(n/2)/2)
        return math.ceil(math.ceil(n / 2) / 2)

    return halved_twice(image_shape[0]) * halved_twice(image_shape[1])


def load_image_encoder(path: str | None = None, *, allow_unpinned: bool = False, resolution: int = 0):
    """The conv parameters of an exported contrastive run (``dew.pinned_weights`` ``.npz`` with
    keys ``<module>/<name>``; its content digest is checked)."""
    from dew import pinned_weights

    del allow_unpinned, resolution  # dew wrote the file itself: its content digest is the check
    if path is None:
        raise ValueError(
            "encoder image_encoder needs its weights: config.objective.repa.encoder_weights=<.npz> "
            "(export a contrastive run with experiments/repa_digits.py export)"
        )
    arrays, _ = pinned_weights.read_npz(path, "image_encoder weights")
    params: dict[str, dict[str, jax.Array]] = {}
    for key, value in arrays.items():
        module, _, name = key.rpartition("/")
        params.setdefault(module, {})[name] = jnp.asarray(value)
    missing = [
        m for m in ("image_encoder/conv0", "image_encoder/conv1", "image_encoder/conv2") if m not in params
    ]
    if missing:
        raise ValueError(f"{path} holds no {missing[0]} parameters: not an exported image_encoder")
    return params


def export_image_encoder(params: Params, path: str) -> str:
    """Write an ``ImageEncoder``'s parameters (from a contrastive run's params tree) as the
    ``.npz`` ``load_image_encoder`` reads; returns its content digest."""
    from dew import pinned_weights

    arrays = {
        f"{module}/{name}": np.asarray(value, np.float32)
        for module, leaves in params.items()
        if module.startswith("image_encoder/")
        for name, value in leaves.items()
    }
    if not arrays:
        raise ValueError("the params hold no image_encoder/* module: not a contrastive image_encoder run")
    return pinned_weights.write_npz(path, arrays, "")


registry.encoders.register(
    "image_encoder",
    RepresentationEncoder(
        "image_encoder", None, load_image_encoder, image_encoder_tokens, _image_encoder_num_tokens
    ),
)


def representation_encoder(name: str) -> RepresentationEncoder:
    """The registered ``RepresentationEncoder`` ``name``; ``KeyError`` naming the registered ones."""
    accepted = representation_encoders()
    if name not in accepted:
        raise KeyError(f"{name!r} is not a registered representation encoder: expected one of {accepted}")
    return registry.encoders[name]


def representation_encoders() -> list[str]:
    """The names of the registered ``RepresentationEncoder``s."""
    return sorted(
        n for n in registry.encoders.names() if isinstance(registry.encoders[n], RepresentationEncoder)
    )
