"""DINOv2 ViT-L/14 and ViT-B/14 in haiku: the CLS features FD_DINOv2 is computed in, with EDM2's
preprocessing, and the patch tokens REPA aligns to, with REPA's resize and position grid.

The network is facebookresearch/dinov2's ``DinoVisionTransformer`` as its hub entry
``dinov2_vitl14`` builds it (``dinov2/models/vision_transformer.py``, ``dinov2/layers/``):
a 14×14 stride-14 patch convolution, a CLS token, learned position embeddings for a 37×37 grid
(``img_size=518``) resampled to the input's grid, 24 pre-norm blocks
``x + ls1 · attn(norm1 x)``, ``x + ls2 · mlp(norm2 x)`` (LayerNorm ε = 1e-6, fused ``qkv``
projection with bias, softmax(q kᵀ / √d_head) v, exact-erf GELU MLP of ratio 4, LayerScale
``gamma``), a final LayerNorm, and the normalised CLS token as the output
(``forward`` → ``head(x_norm_clstoken)`` with an identity head): 1024 features.

Position embeddings follow ``interpolate_pos_encoding`` exactly: bicubic (A = −0.75, no
antialiasing, indices clamped at the border) with ``scale_factor = (g + 0.1) / 37`` for a
g×g patch grid, so the source coordinate of output cell i is (i + 0.5)·37/(g + 0.1) − 0.5
(PyTorch uses the given scale factor, not the size ratio).

Preprocessing follows NVlabs/edm2 ``calculate_metrics.py`` ``DINOv2Detector`` with its default
``resize_mode='torch'``: ``F.interpolate(x, size=(224, 224), mode='bicubic', antialias=True)``
on the uint8 values as float32 (PyTorch's antialiased bicubic is PIL's: filter a = −0.5, support
2·max(scale, 1), taps clipped to the image and renormalised), then ``x / 255``, minus the
ImageNet mean (0.485, 0.456, 0.406), divided by the std (0.229, 0.224, 0.225). Both resamplings
are separable linear maps whose matrices are built on the host from static shapes
(``antialiased_bicubic_matrix``, ``bicubic_matrix``), so ``features`` is a pure jittable function.

Weights: ``dew.scoring.dinov2_weights`` converts the official ``dinov2_vitl14_pretrain.pth``
state_dict once to an ``.npz`` under its PyTorch names; ``params_from_torch_names`` maps them
onto this module's haiku parameters.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

LAYER_NORM_EPS = 1e-6
RESOLUTION = 224  # edm2 DINOv2Detector: size=(224, 224)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATE_OFFSET = 0.1  # dinov2 hub default (_make_dinov2_model: interpolate_offset=0.1)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """The shape of a DINOv2 vision transformer; the defaults are ViT-L/14 (``dinov2_vitl14``)."""

    embed_dim: int = 1024
    depth: int = 24
    num_heads: int = 16
    patch_size: int = 14
    mlp_ratio: int = 4
    train_grid: int = 37  # img_size 518 // patch 14: the grid the position embeddings were learned on

    def __post_init__(self):
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim={self.embed_dim} must be a multiple of num_heads={self.num_heads}")


VIT_L14 = ViTConfig()
VIT_B14 = ViTConfig(embed_dim=768, depth=12, num_heads=12)
"""``dinov2_vitb14``: REPA's default encoder (``--enc-type=dinov2-vit-b``)."""
VIT_CONFIGS = {"vitl14": VIT_L14, "vitb14": VIT_B14}
OUTPUTS = ("cls", "patch")


def _pil_bicubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    """PIL's (and PyTorch's antialiased) bicubic filter."""
    x = np.abs(x)
    inner = ((a + 2) * x - (a + 3)) * x * x + 1
    outer = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, inner, np.where(x < 2, outer, 0.0))


@functools.cache
def antialiased_bicubic_matrix(in_size: int, out_size: int) -> np.ndarray:
    """[out, in] float32 weights of ``F.interpolate(mode='bicubic', antialias=True,
    align_corners=False)`` along one axis (ATen ``_compute_index_ranges_weights`` with the aa
    bicubic filter): centre (i + 0.5)·s, support 2·max(s, 1) for s = in/out, taps in
    [trunc(centre − support + 0.5), trunc(centre + support + 0.5)) clipped to the image, filter
    evaluated at (j − centre + 0.5)/max(s, 1), weights normalised to sum 1."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    m = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        centre = scale * (i + 0.5)
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), in_size)
        j = np.arange(lo, hi)
        w = _pil_bicubic((j - centre + 0.5) * inv)
        m[i, lo:hi] = w / w.sum()
    return m.astype(np.float32)


@functools.cache
def bicubic_matrix(in_size: int, out_size: int, scale_factor: float) -> np.ndarray:
    """[out, in] float32 weights of ``F.interpolate(mode='bicubic', scale_factor=scale_factor,
    align_corners=False, antialias=False)`` along one axis (ATen ``upsample_bicubic2d``):
    source x = (i + 0.5)/scale_factor − 0.5, the four taps floor(x) − 1 … floor(x) + 2 clamped
    to [0, in − 1], Keys' cubic with A = −0.75."""
    a = -0.75
    m = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        x = (i + 0.5) / scale_factor - 0.5
        x0 = int(np.floor(x))
        t = x - x0
        coeffs = (
            ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
        )
        for k, c in enumerate(coeffs):
            m[i, min(max(x0 - 1 + k, 0), in_size - 1)] += c
    return m.astype(np.float32)


def preprocess(images: jax.Array, value_range: tuple[float, float] = (0.0, 255.0)) -> jax.Array:
    """NHWC images in ``value_range`` (uint8 in [0, 255] is edm2's input) → [N, 224, 224, 3]
    float32 normalised as edm2's ``DINOv2Detector`` does. One channel is repeated to three."""
    chex.assert_rank(images, 4)
    if images.shape[-1] == 1:
        images = jnp.repeat(images, 3, axis=-1)
    chex.assert_axis_dimension(images, 3, 3)
    lo, hi = value_range
    x = images.astype(jnp.float32)
    if (lo, hi) != (0.0, 255.0):
        x = (x - lo) * (255.0 / (hi - lo))
    rows = jnp.asarray(antialiased_bicubic_matrix(images.shape[1], RESOLUTION))
    cols = jnp.asarray(antialiased_bicubic_matrix(images.shape[2], RESOLUTION))
    x = jnp.einsum("oh,nhwc->nowc", rows, x, precision=jax.lax.Precision.HIGHEST)
    x = jnp.einsum("pw,nowc->nopc", cols, x, precision=jax.lax.Precision.HIGHEST)
    x = x / 255.0
    x = (x - jnp.asarray(IMAGENET_MEAN, jnp.float32)) / jnp.asarray(IMAGENET_STD, jnp.float32)
    return x


class Block(hk.Module):
    """One pre-norm transformer block (dinov2 ``NestedTensorBlock`` at inference)."""

    def __init__(self, config: ViTConfig, name: str | None = None):
        super().__init__(name=name)
        self.config = config

    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        n, t, d = x.shape
        hp = jax.lax.Precision.HIGHEST

        low = x.dtype != jnp.float32  # a low-precision run: statistics and softmax in float32

        def norm(name, y):
            layer = hk.LayerNorm(
                axis=-1, create_scale=True, create_offset=True, eps=LAYER_NORM_EPS, name=name
            )
            return layer(y.astype(jnp.float32)).astype(y.dtype) if low else layer(y)

        h = norm("norm1", x)
        qkv = hk.Linear(3 * d, name="qkv")(h).reshape(n, t, 3, c.num_heads, d // c.num_heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [n, t, heads, d_head]
        logits = jnp.einsum("nthd,nshd->nhts", q, k, precision=hp) * (d // c.num_heads) ** -0.5
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(v.dtype) if low else None
        attn = jnp.einsum(
            "nhts,nshd->nthd", jax.nn.softmax(logits, axis=-1) if probs is None else probs, v, precision=hp
        )
        h = hk.Linear(d, name="proj")(attn.reshape(n, t, d))
        x = x + h * hk.get_parameter("ls1", (d,), x.dtype, jnp.ones)
        h = norm("norm2", x)
        h = hk.Linear(c.mlp_ratio * d, name="fc1")(h)
        h = hk.Linear(d, name="fc2")(jax.nn.gelu(h, approximate=False))
        return x + h * hk.get_parameter("ls2", (d,), x.dtype, jnp.ones)


class DinoViT(hk.Module):
    """``DinoVisionTransformer.forward`` at inference: [N, H, W, 3] normalised images (H, W
    multiples of the patch size) → [N, embed_dim] normalised CLS features (``output="cls"``),
    or ``forward_features``' ``x_norm_patchtokens`` [N, (H/14)·(W/14), embed_dim]
    (``output="patch"``, what REPA aligns to)."""

    def __init__(self, config: ViTConfig = VIT_L14, output: str = "cls", name: str | None = "dinov2"):
        super().__init__(name=name)
        if output not in OUTPUTS:
            raise ValueError(f"DinoViT: output={output!r} is invalid: expected one of {OUTPUTS}")
        self.config = config
        self.output = output

    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        chex.assert_rank(x, 4)
        n, h, w, _ = x.shape
        if h % c.patch_size or w % c.patch_size:
            raise ValueError(f"image size {h}x{w} must be a multiple of the patch size {c.patch_size}")
        p, d = c.patch_size, c.embed_dim
        kernel = hk.get_parameter("patch_w", (p, p, x.shape[-1], d), x.dtype, jnp.zeros)
        bias = hk.get_parameter("patch_b", (d,), x.dtype, jnp.zeros)
        tokens = jax.lax.conv_general_dilated(
            x,
            kernel,
            (p, p),
            "VALID",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=jax.lax.Precision.HIGHEST,
        )
        gh, gw = h // p, w // p
        tokens = (tokens + bias).reshape(n, gh * gw, d)
        cls = hk.get_parameter("cls_token", (1, 1, d), x.dtype, jnp.zeros)
        tokens = jnp.concatenate([jnp.broadcast_to(cls, (n, 1, d)), tokens], axis=1)
        tokens = tokens + self._position_embeddings(gh, gw, x.dtype)
        for i in range(c.depth):
            tokens = Block(c, name=f"block_{i}")(tokens)
        final = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=LAYER_NORM_EPS, name="norm")
        dtype = tokens.dtype  # a low-precision run's statistics in float32, as the blocks'
        tokens = final(tokens) if dtype == jnp.float32 else final(tokens.astype(jnp.float32)).astype(dtype)
        if self.output == "patch":
            return tokens[:, 1:]
        features = tokens[:, 0]
        chex.assert_shape(features, (n, d))
        return features

    def _position_embeddings(self, gh: int, gw: int, dtype) -> jax.Array:
        """``interpolate_pos_encoding``: the learned grid as is when it matches, else resampled."""
        c = self.config
        g = c.train_grid
        pos = hk.get_parameter("pos_embed", (1, g * g + 1, c.embed_dim), dtype, jnp.zeros)
        if gh * gw == g * g and gh == gw:
            return pos
        grid = pos[0, 1:].reshape(g, g, c.embed_dim)
        rows = jnp.asarray(bicubic_matrix(g, gh, (gh + INTERPOLATE_OFFSET) / g))
        cols = jnp.asarray(bicubic_matrix(g, gw, (gw + INTERPOLATE_OFFSET) / g))
        hp = jax.lax.Precision.HIGHEST
        grid = jnp.einsum("ab,bcd->acd", rows, grid, precision=hp)
        grid = jnp.einsum("ec,acd->aed", cols, grid, precision=hp)
        return jnp.concatenate([pos[:, :1], grid.reshape(1, gh * gw, c.embed_dim)], axis=1)


def _forward(x: jax.Array, config: ViTConfig, output: str) -> jax.Array:
    return DinoViT(config, output)(x)


@functools.cache
def network(config: ViTConfig = VIT_L14, output: str = "cls") -> hk.Transformed:
    """The haiku-transformed ``DinoViT`` (no randomness: ``apply(params, x)``)."""
    return hk.without_apply_rng(hk.transform(functools.partial(_forward, config=config, output=output)))


def features(
    params: hk.Params,
    images: jax.Array,
    value_range: tuple[float, float] = (0.0, 255.0),
    config: ViTConfig = VIT_L14,
) -> jax.Array:
    """FD_DINOv2 features: edm2's preprocessing then the ViT's CLS output, [N, embed_dim] float32."""
    return network(config).apply(params, preprocess(images, value_range))


def config_from_torch_names(arrays: Mapping[str, np.ndarray]) -> ViTConfig:
    """The ``ViTConfig`` a state_dict's shapes imply (heads are not in the shapes: 64 per head,
    as every DINOv2 backbone has, unless the config passed to ``params_from_torch_names`` says)."""
    d = arrays["cls_token"].shape[-1]
    depth = len({k.split(".")[1] for k in arrays if k.startswith("blocks.")})
    grid = round((arrays["pos_embed"].shape[1] - 1) ** 0.5)
    return ViTConfig(
        embed_dim=d,
        depth=depth,
        num_heads=max(d // 64, 1),
        patch_size=arrays["patch_embed.proj.weight"].shape[-1],
        mlp_ratio=arrays["blocks.0.mlp.fc1.weight"].shape[0] // d,
        train_grid=grid,
    )


_BLOCK_ARRAYS = (
    "norm1.weight",
    "norm1.bias",
    "norm2.weight",
    "norm2.bias",
    "ls1.gamma",
    "ls2.gamma",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.proj.weight",
    "attn.proj.bias",
    "mlp.fc1.weight",
    "mlp.fc1.bias",
    "mlp.fc2.weight",
    "mlp.fc2.bias",
)


def params_from_torch_names(arrays: Mapping[str, np.ndarray], config: ViTConfig = VIT_L14) -> hk.Params:
    """Haiku params of ``DinoViT(config)`` from a dinov2 state_dict (PyTorch names; Linear
    weights [out, in] transposed, the OIHW patch kernel to HWIO). ``mask_token`` (training only)
    is ignored. Raises ``KeyError``/``ValueError`` naming the first missing or mis-shaped array."""

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in arrays:
            raise KeyError(f"DINOv2 weights lack {name!r}")
        a = np.asarray(arrays[name], np.float32)
        if a.shape != shape:
            raise ValueError(f"DINOv2 weight {name!r} has shape {a.shape}, expected {shape}")
        return a

    d, p, g, hidden = (
        config.embed_dim,
        config.patch_size,
        config.train_grid,
        config.mlp_ratio * config.embed_dim,
    )
    root = "dinov2"
    params: dict[str, dict[str, np.ndarray]] = {
        root: {
            "patch_w": get("patch_embed.proj.weight", (d, 3, p, p)).transpose(2, 3, 1, 0),
            "patch_b": get("patch_embed.proj.bias", (d,)),
            "cls_token": get("cls_token", (1, 1, d)),
            "pos_embed": get("pos_embed", (1, g * g + 1, d)),
        },
        f"{root}/norm": {"scale": get("norm.weight", (d,)), "offset": get("norm.bias", (d,))},
    }
    for i in range(config.depth):
        t, b = f"blocks.{i}.", f"{root}/block_{i}"
        params[b] = {"ls1": get(t + "ls1.gamma", (d,)), "ls2": get(t + "ls2.gamma", (d,))}
        for norm in ("norm1", "norm2"):
            params[f"{b}/{norm}"] = {
                "scale": get(t + norm + ".weight", (d,)),
                "offset": get(t + norm + ".bias", (d,)),
            }
        for ours, theirs, (o, i_) in (
            ("qkv", "attn.qkv", (3 * d, d)),
            ("proj", "attn.proj", (d, d)),
            ("fc1", "mlp.fc1", (hidden, d)),
            ("fc2", "mlp.fc2", (d, hidden)),
        ):
            params[f"{b}/{ours}"] = {
                "w": get(t + theirs + ".weight", (o, i_)).T,
                "b": get(t + theirs + ".bias", (o,)),
            }
    expected = {f"blocks.{i}.{n}" for i in range(config.depth) for n in _BLOCK_ARRAYS} | {
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
        "cls_token",
        "pos_embed",
        "norm.weight",
        "norm.bias",
    }
    extra = sorted(set(arrays) - expected - {"mask_token"})
    if extra:
        raise ValueError(f"DINOv2 weights hold arrays this ViT ({config}) does not use, e.g. {extra[:3]}")
    return {k: {n: jnp.asarray(v) for n, v in m.items()} for k, m in params.items()}


__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "OUTPUTS",
    "RESOLUTION",
    "VIT_B14",
    "VIT_CONFIGS",
    "VIT_L14",
    "DinoViT",
    "ViTConfig",
    "antialiased_bicubic_matrix",
    "bicubic_matrix",
    "config_from_torch_names",
    "features",
    "network",
    "params_from_torch_names",
    "preprocess",
]
