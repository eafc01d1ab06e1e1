"""The FID Inception-v3 feature network in haiku: 2048-d pool features of the TF-FID graph.

The architecture is the Inception-v3 of the original TensorFlow FID code (the 2015-12-05
graph) as pytorch-fid reproduces it (``InceptionV3`` with ``use_fid_inception=True``, output
block 3): torchvision's Inception-v3 stem and blocks with the FID variants of the A, C and E
blocks (their average pools exclude the padding from the count, and the last E block max-pools
its pool branch), followed by a global average pool to 2048 features. Every convolution is
``BasicConv2d``: convolution without bias, batch norm (inference statistics, ε = 0.001), ReLU.

Input handling (``handling``, one of ``IMAGE_HANDLING``):

* ``"pytorch_fid"`` (the default): images in [0, 1] are resized to 299×299 with bilinear
  interpolation (half-pixel centres, no antialiasing: ``F.interpolate(..., mode="bilinear",
  align_corners=False)``), then mapped to [−1, 1] by 2x − 1, as pytorch-fid does.
* ``"tf1"``: the 2015-12-05 TensorFlow graph's own handling, which NVlabs/edm's ``fid.py``
  detector (StyleGAN3's TorchScript ``inception-2015-12-05.pkl``, fed uint8 NCHW at the data
  set's resolution) and torch-fidelity (``interpolate_bilinear_2d_like_tensorflow1x`` in its
  Inception feature extractor) reproduce: pixels in [0, 255] resized by TF1's legacy
  ``ResizeBilinear`` (``align_corners=False``, ``half_pixel_centers=False``: source coordinate
  i·in/out in float32, ``resize_bilinear_tf1``), then mapped by (x − 128) / 128.

``features`` takes NHWC images in ``value_range`` (dew's [−1, 1] by default) and repeats a
single channel to three.

Weights: ``load_weights(path)`` reads the ``.npz`` that ``python -m dew.scoring.convert_inception``
makes once from pytorch-fid's ``pt_inception-2015-12-05-6726825d.pth`` (PyTorch names, OIHW
kernels; see that module). Nothing is downloaded at run time.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from haiku import experimental as hk_experimental

BN_EPS = 1e-3
FEATURE_DIM = 2048
#: The TF graph's ``mixed_6/conv`` (ADM's sFID layer) is the ReLU output of ``Mixed_6d``'s
#: ``branch1x1`` in the PyTorch names of the same graph (``mixed`` = Mixed_5b, ... ``mixed_3`` =
#: Mixed_6a, ``mixed_6`` = Mixed_6d; ``conv`` is each block's first, 1×1 tower).
SPATIAL_BLOCK = "Mixed_6d"
SPATIAL_CHANNELS = 7  # ADM's evaluator keeps mixed_6/conv[..., :7]
CLASSES = 1008  # the graph's softmax width (``softmax/weights`` [2048, 1008], pytorch-fid's fc.weight.T)
RESOLUTION = 299
IMAGE_HANDLING = ("pytorch_fid", "tf1")

# (name, out channels, kernel (h, w), stride, padding (h, w)) of the stem, in order.
_STEM = (
    ("Conv2d_1a_3x3", 32, (3, 3), 2, (0, 0)),
    ("Conv2d_2a_3x3", 32, (3, 3), 1, (0, 0)),
    ("Conv2d_2b_3x3", 64, (3, 3), 1, (1, 1)),
    "maxpool",
    ("Conv2d_3b_1x1", 80, (1, 1), 1, (0, 0)),
    ("Conv2d_4a_3x3", 192, (3, 3), 1, (0, 0)),
    "maxpool",
)


class BasicConv(hk.Module):
    """Convolution (no bias) + inference batch norm (ε = 0.001) + ReLU; parameters ``w`` (HWIO),
    ``scale``, ``offset``, ``mean``, ``var``."""

    def __init__(self, channels: int, kernel: tuple[int, int], stride: int = 1, padding=(0, 0), name=None):
        super().__init__(name=name)
        self.channels, self.kernel, self.stride, self.padding = channels, kernel, stride, padding

    def __call__(self, x: jax.Array) -> jax.Array:
        w = hk.get_parameter("w", (*self.kernel, x.shape[-1], self.channels), x.dtype, jnp.zeros)
        y = jax.lax.conv_general_dilated(
            x,
            w,
            (self.stride, self.stride),
            [(p, p) for p in self.padding],
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=jax.lax.Precision.HIGHEST,
        )
        shape = (self.channels,)
        scale = hk.get_parameter("scale", shape, x.dtype, jnp.ones)
        offset = hk.get_parameter("offset", shape, x.dtype, jnp.zeros)
        mean = hk.get_parameter("mean", shape, x.dtype, jnp.zeros)
        var = hk.get_parameter("var", shape, x.dtype, jnp.ones)
        return jax.nn.relu((y - mean) * (scale * jax.lax.rsqrt(var + BN_EPS)) + offset)


def _max_pool(x: jax.Array, stride: int, padding: int = 0) -> jax.Array:
    pad = ((0, 0), (padding, padding), (padding, padding), (0, 0))
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, stride, stride, 1), pad)


def _avg_pool_exclude_pad(x: jax.Array) -> jax.Array:
    """3×3, stride 1, padding 1, dividing by the number of real (non-padding) inputs."""
    pad = ((0, 0), (1, 1), (1, 1), (0, 0))
    total = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 1, 1), pad)
    ones = jnp.ones((1, *x.shape[1:3], 1), x.dtype)
    count = jax.lax.reduce_window(ones, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 1, 1), pad)
    return total / count


def _block_a(x: jax.Array, pool_features: int, name: str) -> jax.Array:
    with hk_experimental.name_scope(name):
        b1 = BasicConv(64, (1, 1), name="branch1x1")(x)
        b5 = BasicConv(48, (1, 1), name="branch5x5_1")(x)
        b5 = BasicConv(64, (5, 5), padding=(2, 2), name="branch5x5_2")(b5)
        b3 = BasicConv(64, (1, 1), name="branch3x3dbl_1")(x)
        b3 = BasicConv(96, (3, 3), padding=(1, 1), name="branch3x3dbl_2")(b3)
        b3 = BasicConv(96, (3, 3), padding=(1, 1), name="branch3x3dbl_3")(b3)
        bp = BasicConv(pool_features, (1, 1), name="branch_pool")(_avg_pool_exclude_pad(x))
    return jnp.concatenate([b1, b5, b3, bp], axis=-1)


def _block_b(x: jax.Array, name: str) -> jax.Array:
    with hk_experimental.name_scope(name):
        b3 = BasicConv(384, (3, 3), stride=2, name="branch3x3")(x)
        bd = BasicConv(64, (1, 1), name="branch3x3dbl_1")(x)
        bd = BasicConv(96, (3, 3), padding=(1, 1), name="branch3x3dbl_2")(bd)
        bd = BasicConv(96, (3, 3), stride=2, name="branch3x3dbl_3")(bd)
    return jnp.concatenate([b3, bd, _max_pool(x, 2)], axis=-1)


def _block_c(x: jax.Array, c7: int, name: str, taps: dict[str, jax.Array] | None = None) -> jax.Array:
    """Inception-C; with ``taps``, its ``branch1x1`` output is stored under ``name``."""
    row, col = ((1, 7), (0, 3)), ((7, 1), (3, 0))
    with hk_experimental.name_scope(name):
        b1 = BasicConv(192, (1, 1), name="branch1x1")(x)
        if taps is not None:
            taps[name] = b1
        b7 = BasicConv(c7, (1, 1), name="branch7x7_1")(x)
        b7 = BasicConv(c7, row[0], padding=row[1], name="branch7x7_2")(b7)
        b7 = BasicConv(192, col[0], padding=col[1], name="branch7x7_3")(b7)
        bd = BasicConv(c7, (1, 1), name="branch7x7dbl_1")(x)
        bd = BasicConv(c7, col[0], padding=col[1], name="branch7x7dbl_2")(bd)
        bd = BasicConv(c7, row[0], padding=row[1], name="branch7x7dbl_3")(bd)
        bd = BasicConv(c7, col[0], padding=col[1], name="branch7x7dbl_4")(bd)
        bd = BasicConv(192, row[0], padding=row[1], name="branch7x7dbl_5")(bd)
        bp = BasicConv(192, (1, 1), name="branch_pool")(_avg_pool_exclude_pad(x))
    return jnp.concatenate([b1, b7, bd, bp], axis=-1)


def _block_d(x: jax.Array, name: str) -> jax.Array:
    with hk_experimental.name_scope(name):
        b3 = BasicConv(192, (1, 1), name="branch3x3_1")(x)
        b3 = BasicConv(320, (3, 3), stride=2, name="branch3x3_2")(b3)
        b7 = BasicConv(192, (1, 1), name="branch7x7x3_1")(x)
        b7 = BasicConv(192, (1, 7), padding=(0, 3), name="branch7x7x3_2")(b7)
        b7 = BasicConv(192, (7, 1), padding=(3, 0), name="branch7x7x3_3")(b7)
        b7 = BasicConv(192, (3, 3), stride=2, name="branch7x7x3_4")(b7)
    return jnp.concatenate([b3, b7, _max_pool(x, 2)], axis=-1)


def _block_e(x: jax.Array, name: str, max_pool: bool) -> jax.Array:
    with hk_experimental.name_scope(name):
        b1 = BasicConv(320, (1, 1), name="branch1x1")(x)
        b3 = BasicConv(384, (1, 1), name="branch3x3_1")(x)
        b3 = jnp.concatenate(
            [
                BasicConv(384, (1, 3), padding=(0, 1), name="branch3x3_2a")(b3),
                BasicConv(384, (3, 1), padding=(1, 0), name="branch3x3_2b")(b3),
            ],
            axis=-1,
        )
        bd = BasicConv(448, (1, 1), name="branch3x3dbl_1")(x)
        bd = BasicConv(384, (3, 3), padding=(1, 1), name="branch3x3dbl_2")(bd)
        bd = jnp.concatenate(
            [
                BasicConv(384, (1, 3), padding=(0, 1), name="branch3x3dbl_3a")(bd),
                BasicConv(384, (3, 1), padding=(1, 0), name="branch3x3dbl_3b")(bd),
            ],
            axis=-1,
        )
        pooled = _max_pool(x, 1, padding=1) if max_pool else _avg_pool_exclude_pad(x)
        bp = BasicConv(192, (1, 1), name="branch_pool")(pooled)
    return jnp.concatenate([b1, b3, bd, bp], axis=-1)


def resize_bilinear(x: jax.Array, size: tuple[int, int]) -> jax.Array:
    """NHWC bilinear resize as ``F.interpolate(mode="bilinear", align_corners=False)`` without
    antialiasing: source coordinate (i + ½)·in/out − ½, clamped at 0, neighbours clamped at the
    edge; the same formula up and down."""

    def axis_weights(n_in: int, n_out: int) -> np.ndarray:
        src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        frac = src - i0
        m = np.zeros((n_out, n_in), np.float64)
        np.add.at(m, (np.arange(n_out), i0), 1.0 - frac)
        np.add.at(m, (np.arange(n_out), i1), frac)
        return m.astype(np.float32)

    rows, cols = axis_weights(x.shape[1], size[0]), axis_weights(x.shape[2], size[1])
    hp = jax.lax.Precision.HIGHEST
    x = jnp.einsum("oh,nhwc->nowc", rows, x, precision=hp)
    return jnp.einsum("pw,nowc->nopc", cols, x, precision=hp)


def _tf1_axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TF1 legacy bilinear taps along one axis: float32 source ``i · (in/out)`` (the scale a
    float32 quotient, as ``CalculateResizeScale``), lower index its floor, upper index the next
    one clamped to the edge, and the float32 fraction between them."""
    scale = np.float32(n_in) / np.float32(n_out)
    src = np.arange(n_out, dtype=np.float32) * scale
    lo = np.floor(src).astype(np.int64)
    return lo, np.minimum(lo + 1, n_in - 1), (src - lo.astype(np.float32)).astype(np.float32)


def resize_bilinear_tf1(x: jax.Array, size: tuple[int, int]) -> jax.Array:
    """NHWC bilinear resize as TensorFlow 1.x's ``ResizeBilinear`` with ``align_corners=False``
    and ``half_pixel_centers=False`` (the 2015-12-05 FID graph's resize): output (i, j) reads
    source (i·H/h, j·W/w), no half-pixel shift, no antialiasing, neighbours clamped at the
    bottom/right edge; interpolated as TF does, along the width on the two source rows
    (``a + (b − a)·t``), then between those rows."""
    if x.ndim != 4:
        raise ValueError(f"resize_bilinear_tf1: x must be NHWC, got shape {x.shape}")
    y0, y1, dy = _tf1_axis(x.shape[1], size[0])
    x0, x1, dx = _tf1_axis(x.shape[2], size[1])
    x = x.astype(jnp.float32)

    def along_width(rows: jax.Array) -> jax.Array:
        left, right = jnp.take(rows, x0, axis=2), jnp.take(rows, x1, axis=2)
        return left + (right - left) * dx[:, None]

    top, bottom = along_width(jnp.take(x, y0, axis=1)), along_width(jnp.take(x, y1, axis=1))
    return top + (bottom - top) * dy[:, None, None]


def _network(x: jax.Array, taps: dict[str, jax.Array] | None = None) -> jax.Array:
    """[N, H, W, 3] in [−1, 1] (already resized) -> [N, 2048]; ``taps`` receives every
    Inception-C block's ``branch1x1`` output by block name."""
    with hk_experimental.name_scope("inception_fid"):
        for layer in _STEM:
            x = _max_pool(x, 2) if layer == "maxpool" else BasicConv(*layer[1:], name=layer[0])(x)
        x = _block_a(x, 32, "Mixed_5b")
        x = _block_a(x, 64, "Mixed_5c")
        x = _block_a(x, 64, "Mixed_5d")
        x = _block_b(x, "Mixed_6a")
        for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
            x = _block_c(x, c7, name, taps)
        x = _block_d(x, "Mixed_7a")
        x = _block_e(x, "Mixed_7b", max_pool=False)
        x = _block_e(x, "Mixed_7c", max_pool=True)
    return jnp.mean(x, axis=(1, 2))


network = hk.without_apply_rng(hk.transform(_network))


def _network_adm(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    taps: dict[str, jax.Array] = {}
    pool = _network(x, taps)
    return pool, taps[SPATIAL_BLOCK]


#: The same parameters as ``network``; apply gives (pool [N, 2048], ``mixed_6/conv`` [N, 17, 17, 192]).
network_adm = hk.without_apply_rng(hk.transform(_network_adm))


def check_handling(handling: str, flag: str = "handling") -> str:
    """``handling`` if it is one of ``IMAGE_HANDLING``; ``ValueError`` naming ``flag`` otherwise."""
    if handling not in IMAGE_HANDLING:
        raise ValueError(
            f"{flag}={handling!r} is not an image handling; expected one of {list(IMAGE_HANDLING)}"
        )
    return handling


def preprocess(
    images: jax.Array,
    value_range: tuple[float, float] = (-1.0, 1.0),
    resize: bool = True,
    handling: str = "pytorch_fid",
) -> jax.Array:
    """NHWC images in ``value_range`` -> the network's input [N, 299, 299, 3] in about [−1, 1]:
    one channel repeated to three, then ``handling`` (module docstring): ``"pytorch_fid"``
    maps to [0, 1], resizes half-pixel bilinear, maps by 2x − 1; ``"tf1"`` maps to [0, 255]
    (exactly, for uint8 images given with ``value_range=(0, 255)``), resizes as TF1's legacy
    ``ResizeBilinear``, maps by (x − 128) / 128."""
    check_handling(handling)
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"inception features: images must be [N, H, W, 1 or 3], got shape {images.shape}")
    lo, hi = value_range
    x = images.astype(jnp.float32)
    if x.shape[-1] == 1:
        x = jnp.repeat(x, 3, axis=-1)
    if handling == "tf1":
        x = (x - lo) * (255.0 / (hi - lo))  # a multiply by exactly 1 for (0, 255)
        if resize:
            x = resize_bilinear_tf1(x, (RESOLUTION, RESOLUTION))
        return (x - 128.0) / 128.0
    x = (x - lo) / (hi - lo)
    if resize:
        x = resize_bilinear(x, (RESOLUTION, RESOLUTION))
    return 2.0 * x - 1.0


def features(
    params: hk.Params,
    images: jax.Array,
    value_range: tuple[float, float] = (-1.0, 1.0),
    resize: bool = True,
    handling: str = "pytorch_fid",
) -> jax.Array:
    """2048-d FID features [N, 2048] of NHWC images in ``value_range`` with the input
    ``handling`` of ``preprocess``; pure, jit it (``handling`` static).

    ``resize=False`` feeds the images at their own size (at least 75×75), as pytorch-fid's
    ``resize_input=False``."""
    x = preprocess(images, value_range, resize, handling)
    if min(x.shape[1:3]) < 75:
        raise ValueError(f"inception features: images must be at least 75x75 without resizing, got {x.shape}")
    return network.apply(params, x)


def adm_features(
    params: hk.Params,
    images: jax.Array,
    value_range: tuple[float, float] = (0.0, 255.0),
    handling: str = "tf1",
) -> tuple[jax.Array, jax.Array]:
    """What ADM's evaluator (openai/guided-diffusion ``evaluations/evaluator.py``) takes from the
    graph for each image: ``pool_3`` [N, 2048] and ``mixed_6/conv[..., :7]`` flattened in NHWC
    order [N, 17·17·7 = 2023] (its ``spatial[..., :7]`` and ``reshape([N, -1])``). Its images go
    into the graph at their own size, so ``handling`` defaults to the graph's own (``"tf1"``),
    ``value_range`` to its uint8 pixels."""
    x = preprocess(images, value_range, True, handling)
    pool, spatial = network_adm.apply(params, x)
    spatial = spatial[..., :SPATIAL_CHANNELS]
    return pool, spatial.reshape(spatial.shape[0], -1)


def logits(pool: jax.Array, classifier: jax.Array) -> jax.Array:
    """ADM's Inception-Score logits, ``pool_3 @ softmax/weights`` without the bias
    (``_create_softmax_graph``): ``pool`` [N, 2048] times ``classifier`` = pytorch-fid's
    ``fc.weight`` [1008, 2048] transposed, in float32 at full precision."""
    return jnp.matmul(pool, classifier.T, precision=jax.lax.Precision.HIGHEST)


def params_from_torch_names(arrays: Mapping[str, np.ndarray]) -> hk.Params:
    """Haiku params from PyTorch ``state_dict`` names (``Mixed_5b.branch1x1.conv.weight``,
    ``....bn.weight``/``bias``/``running_mean``/``running_var``), kernels OIHW -> HWIO."""
    fields = {"conv.weight": "w", "bn.weight": "scale", "bn.bias": "offset", "bn.running_mean": "mean"}
    fields["bn.running_var"] = "var"
    params: dict[str, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        module, _, field = next(
            ((key[: -len(f) - 1], f, fields[f]) for f in fields if key.endswith("." + f)), (None, None, None)
        )
        if module is None or field is None:  # (both None together)
            continue  # num_batches_tracked, the classifier head
        path = "inception_fid/" + module.replace(".", "/")
        value = np.asarray(value, np.float32)
        params.setdefault(path, {})[field] = value.transpose(2, 3, 1, 0) if field == "w" else value
    expected = _expected_shapes()
    missing = sorted(set(expected) - set(params))
    if missing:
        raise ValueError(f"Inception weights lack {len(missing)} layers, e.g. {missing[:3]}")
    for path, leaves in expected.items():
        for name, shape in leaves.items():
            got = params[path].get(name)
            if got is None or got.shape != shape:
                raise ValueError(
                    f"Inception weights: {path}/{name} has shape {None if got is None else got.shape}, "
                    f"the FID network needs {shape}"
                )
    return {
        k: {n: jnp.asarray(v) for n, v in leaves.items()} for k, leaves in params.items() if k in expected
    }


@functools.cache
def _expected_shapes() -> dict[str, dict[str, tuple[int, ...]]]:
    shapes = jax.eval_shape(network.init, jax.random.PRNGKey(0), jnp.zeros((1, RESOLUTION, RESOLUTION, 3)))
    return {k: {n: tuple(v.shape) for n, v in leaves.items()} for k, leaves in shapes.items()}


__all__ = [
    "CLASSES",
    "FEATURE_DIM",
    "IMAGE_HANDLING",
    "SPATIAL_BLOCK",
    "SPATIAL_CHANNELS",
    "adm_features",
    "check_handling",
    "features",
    "logits",
    "network",
    "network_adm",
    "params_from_torch_names",
    "preprocess",
    "resize_bilinear",
    "resize_bilinear_tf1",
]
