"""bfloat16 for the modality objectives (``config.precision.compute``): the ``autoencoder``
(Stable Diffusion's VAE at ``experiments/latent_digits_vae.py``'s shape), the ``language`` model
(``experiments/lm.py``'s byte transformer) and the ``contrastive`` encoder
(``experiments/probe.py``'s), and REPA's frozen representation encoders (DINOv2 as REPA feeds
it, dew's ``image_encoder``) when the run computes in bfloat16.

The bound is ``tests/test_precision_transformers.py``'s (its module docstring derives it): n_f
= the equations of the bfloat16 program whose output is bfloat16, u = 2^-8; the loss may differ
from float32's by 2·√(n_f/3)·u relatively, the gradient by 2·√(2 n_f/3)·u norm-wise, and the
frozen encoder's tokens (a forward program only) by 2·√(n_f/3)·u norm-wise. The network must
also really compute in bfloat16: the gradients (the tokens) differ from float32's by more than
float32 rounding, and the float32 policy adds no operation (the program holds no bf16 value).

ReLU's kink. The bound is first order: it holds for smooth networks (the VAE's SiLU, the byte
transformer's GELU). The contrastive encoder's ReLUs have a derivative that jumps at 0, so a
unit whose pre-activation lies within its rounding error ε of 0 may switch on or off, adding
or removing its whole contribution to the gradient. A pre-activation of spread σ has density
at most 1/(σ√(2π)) at 0 (a Gaussian's, at its mean), so at most a share f = 2ε/√(2π) of the
units switch, with ε the forward bound 2·√(n_f/3)·u relative to σ; contributions of similar
size and independent signs move the gradient by √f norm-wise, which the gradient bound then
adds. Measured (probe.py's encoder, 8 images): 0.098 against 0.047 + 0.16; with GELU in
place of ReLU the error is 0.015, inside the first-order bound alone.
"""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import ROOT
from PIL import Image
from test_precision_transformers import U, batch_for, bf16_roundings, roundoff_errors
from test_repa import TINY, _dino_params, dino, encoder_file  # noqa: F401 - test_repa's fixtures

from dew.config import load_config
from dew.data.sources.digits import digits
from dew.objectives import repa_encoders
from dew.scoring import dinov2, dinov2_repa
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer_config import resolve_config

RUNS = {  # run: (experiment, overrides, whether its network has ReLU kinks)
    "autoencoder (SD's VAE)": ("latent_digits_vae.py", {"dataset.batch_size": 4}, False),
    "language (byte transformer)": ("lm.py", {"dataset.batch_size": 4}, False),
    "contrastive (image encoder)": ("probe.py", {"dataset.batch_size": 8}, True),
}


@pytest.fixture(scope="module")
def digit_folder(tmp_path_factory):
    """The first 16 training digits as ``experiments/latent_digits_data.py --images_only`` writes
    them: 32x32 RGB PNGs (each pixel repeated 4x4) in NVlabs/edm's folder format."""
    folder = tmp_path_factory.mktemp("digits32")
    pixels = np.round((np.asarray(digits("train").fields["image"][:16]) + 1.0) * 127.5).clip(0, 255)
    pixels = pixels.astype(np.uint8).repeat(4, axis=1).repeat(4, axis=2).repeat(3, axis=3)
    for i, image in enumerate(pixels):
        Image.fromarray(image).save(folder / f"img{i:05d}.png")
    (folder / "dataset.json").write_text(json.dumps({"labels": None}))
    return str(folder)


def objective_for(run: str, compute: str, folder: str):
    spec, overrides, _ = RUNS[run]
    config = load_config(str(ROOT / "experiments" / spec))
    if config.dataset.name == "image_folder":
        overrides = {**overrides, "dataset.path": folder}
    settings = [
        f"config.{k}={v}" if isinstance(v, str) else f"config.{k}={v!r}"
        for k, v in {**overrides, "precision.compute": compute}.items()
    ]
    c = resolve_config(config, settings)
    return build_objective(c, open_split(c.dataset, "train")), c


def loss_program(objective, params, batch) -> str:
    return str(
        jax.make_jaxpr(lambda p: objective.loss(p, jax.random.PRNGKey(1), batch, Step(jnp.int32(0))))(params)
    )


@pytest.mark.parametrize("run", list(RUNS))
def test_bfloat16_loss_and_gradients_agree_with_float32_within_the_roundoff_bound(run, digit_folder):
    reference, c32 = objective_for(run, "float32", digit_folder)
    low, _ = objective_for(run, "bfloat16", digit_folder)
    n_f, loss_error, gradient_error = roundoff_errors(reference, low, c32)
    loss_bound = 2 * math.sqrt(n_f / 3) * U
    gradient_bound = 2 * math.sqrt(2 * n_f / 3) * U
    if RUNS[run][2]:  # units switched by rounding across ReLU's kink (module docstring)
        gradient_bound += math.sqrt(2 * loss_bound / math.sqrt(2 * math.pi))
    assert loss_error <= loss_bound, (n_f, loss_error, loss_bound)
    assert gradient_error <= gradient_bound, (n_f, gradient_error, gradient_bound)
    assert gradient_error > 2.0**-20, "bfloat16 gave float32's gradients: the network ran in float32"


@pytest.mark.parametrize("run", list(RUNS))
def test_the_float32_policy_adds_no_operation(run, digit_folder):
    objective, c = objective_for(run, "float32", digit_folder)
    batch = batch_for(objective, c)
    params = jax.eval_shape(objective.init, jax.random.PRNGKey(0), batch)
    assert "bf16" not in loss_program(objective, params, batch)


# --- REPA's frozen encoders ----------------------------------------------------------------------


def seeded_vit_params(config: dinov2.ViTConfig, seed: int = 0) -> dict:
    """ViT parameters of ``config``'s shapes, seeded (the published weights are not in the
    repository): kernels N(0, 1/fan_in), biases and embeddings N(0, 0.02²), LayerNorm scale 1 and
    offset N(0, 0.02²), LayerScale 0.5."""
    shapes = jax.eval_shape(
        dinov2.network(config, "patch").init,
        jax.random.PRNGKey(0),
        jax.ShapeDtypeStruct((1, config.patch_size, config.patch_size, 3), jnp.float32),
    )
    rng = np.random.default_rng(seed)

    def leaf(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name == "scale":
            return np.ones(shape, np.float32)
        if name in ("ls1", "ls2"):
            return np.full(shape, 0.5, np.float32)
        std = 1 / math.sqrt(math.prod(shape[:-1])) if name in ("w", "patch_w") else 0.02
        return (std * rng.standard_normal(shape)).astype(np.float32)

    return {m: {k: jnp.asarray(leaf(k, v.shape)) for k, v in leaves.items()} for m, leaves in shapes.items()}


def encoder_case(name: str, golden: dict, weights_file: str):
    """(tokens(params, images, compute_dtype), float32 params, images) of one frozen encoder;
    ``golden``: test_repa's DINOv2 golden (its images, its tiny ViT's weights), ``weights_file``:
    exported ``image_encoder`` weights."""
    images = golden["images"].transpose(0, 2, 3, 1)  # two 256x256 uint8 images
    if name == "dinov2-vit-b (ViT-B/14, seeded weights)":
        encoder = repa_encoders.representation_encoder("dinov2-vit-b")
        params = seeded_vit_params(dinov2_repa.repa_config(dinov2.VIT_B14, 16))
        return (
            lambda p, x, dtype: encoder.tokens(p, x, (0.0, 255.0), None, compute_dtype=dtype),
            params,
            images,
        )
    if name == "dinov2 (the official ViT's weights at a tiny width)":
        tiny = functools.partial(repa_encoders.dinov2_tokens, TINY)
        return lambda p, x, dtype: tiny(p, x, compute_dtype=dtype), _dino_params(golden), images
    encoder = repa_encoders.representation_encoder("image_encoder")
    params = encoder.load(weights_file)
    digits8 = np.asarray(digits("train").fields["image"][:8])  # [-1, 1], as REPA's digits runs feed it
    return lambda p, x, dtype: encoder.tokens(p, x, (-1.0, 1.0), None, compute_dtype=dtype), params, digits8


ENCODERS = (
    "dinov2-vit-b (ViT-B/14, seeded weights)",
    "dinov2 (the official ViT's weights at a tiny width)",
    "image_encoder (dew's contrastive encoder)",
)


@pytest.mark.parametrize("name", ENCODERS)
def test_the_frozen_encoder_computes_in_bfloat16_within_the_roundoff_bound(name, request):
    """REPA's targets under the bfloat16 policy: the encoder's tokens within 2·√(n_f/3)·u of
    float32's norm-wise (n_f counted in the bfloat16 tokens' program), float32 tokens from float32
    weights, and a float32 program with no bfloat16 in it."""
    golden, weights = request.getfixturevalue("dino"), request.getfixturevalue("encoder_file")
    tokens, params, images = encoder_case(name, golden, weights)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    z32 = jax.jit(lambda p, x: tokens(p, x, "float32"))(params, images)
    z16 = jax.jit(lambda p, x: tokens(p, x, "bfloat16"))(params, images)
    assert z32.dtype == z16.dtype == jnp.float32 and z16.shape == z32.shape

    class Forward:  # bf16_roundings reads a program through an objective's ``loss``
        @staticmethod
        def loss(p, rng, x, step):
            return tokens(p, x, "bfloat16")

    n_f = bf16_roundings(Forward, params, images)
    assert n_f > 0, "the bfloat16 encoder computes nothing in bfloat16"
    a, b = np.asarray(z32, np.float64), np.asarray(z16, np.float64)
    assert np.all(np.isfinite(b))
    error, bound = np.linalg.norm(b - a) / np.linalg.norm(a), 2 * math.sqrt(n_f / 3) * U
    assert error <= bound, (n_f, error, bound)
    assert error > 2.0**-20, "bfloat16 gave float32's tokens: the encoder ran in float32"
    assert "bf16" not in str(jax.make_jaxpr(lambda p, x: tokens(p, x, "float32"))(params, images))
