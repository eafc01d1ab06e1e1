"""Published DiT/SiT/REPA latents decode to the references' own bytes: the latents in
``third_party/sd_vae/decode_goldens`` went through DiT's ``sample_ddp.py`` and REPA's
``generate.py`` lines on diffusers' ``AutoencoderKL`` (random weights, sd-vae-ft-mse's
architecture at a small width, stored as the safetensors file dew's loader reads); here the
same latents go through the run that ``experiments/dit.py`` / ``repa.py`` configure
(``config.objective.latent``: the VAE loaded from that file, the experiments' scaling and pixel
convention), by the paths ``dew.pipeline`` / ``python -m dew.sample`` (``LatentSpace.to_images``,
then the artifact's uint8) and ``python -m dew.fid`` (the presets' ``to_uint8``) take.

Tolerance: the decoder's float32 output may differ from the reference's float32 one by
roundoff; ``DELTA`` bounds |dew − float64 decode| (checked first). A uint8 can then differ from
the reference's only where the rule's value (127.5·y + 128, 255·(y + 1)/2), computed from the
float64 decode, lies within 255·DELTA of an integer, where the truncation can go either way; there
it may be off by one, everywhere else it must be equal."""

from __future__ import annotations

import json
import types

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers_common import ROOT

from dew.artifacts import ImageGrid
from dew.config import load_config
from dew.objectives import latent_space, protocol_presets
from dew.schema import Key

pytestmark = pytest.mark.default_compiler  # compares with recorded goldens at XLA's default optimisation

HERE = ROOT / "third_party" / "sd_vae" / "decode_goldens"


@pytest.fixture(scope="module")
def golden():
    with np.load(HERE / "decode_goldens.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def latent_run(golden, experiment: str) -> latent_space.LatentSpace:
    """``config.objective.latent`` as the experiment sets it, its VAE the golden file's."""
    config = load_config(str(ROOT / "experiments" / experiment))
    vae = json.loads(str(golden["config"]))
    section = {k: key.default for k, key in latent_space.CONFIG.keys.items() if isinstance(key, Key)}
    section.update(config.objective.latent.to_dict())
    section.update(
        weights=str(HERE / "tiny_vae.safetensors"),
        allow_unpinned=True,  # random weights: no published digest
        vae_channels=tuple(vae["block_out_channels"]),
        vae_layers_per_block=vae["layers_per_block"],
        vae_groups=vae["norm_num_groups"],
    )
    latent = latent_space.from_config(ml_collections.ConfigDict(section))
    assert latent is not None
    return latent


def nhwc(x: np.ndarray) -> jnp.ndarray:
    return jnp.asarray(x.transpose(0, 2, 3, 1))


def delta(golden) -> float:
    """A bound on float32 roundoff in the decoder's output: 4 times what the reference's own
    float32 decode shows against its float64 one (2.66e-6 on |y| ≤ 3.6); dew's accumulation
    order differs from PyTorch's, the factor covers it (measured: dew's 2.93e-6, 1.1 times).
    Both float32 values then lie within 127.5·d of the float64 rule's value, well inside 255·d;
    the rule's own float32 arithmetic (two or three roundings of values ≤ 460) adds < 1e-4."""
    return 4 * float(np.abs(golden["decoded"] - golden["decoded64"]).max())


def assert_bytes(got: np.ndarray, want: np.ndarray, exact_value: np.ndarray, d: float) -> None:
    """``got`` == ``want`` except where ``exact_value`` (the rule's value in float64) lies within
    255·d of an integer; there off by one at most."""
    assert got.dtype == np.uint8 and got.shape == want.shape
    ambiguous = near_integer(exact_value, d)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert np.all(diff <= 1), np.argwhere(diff > 1)[:5]
    assert np.all((diff == 0) | ambiguous), (int(np.sum((diff > 0) & ~ambiguous)), int(ambiguous.sum()))
    assert ambiguous.mean() < 0.01  # the allowance is narrow: nearly every byte is checked exactly


def near_integer(value: np.ndarray, d: float) -> np.ndarray:
    """Where the unclamped rule's value lies within 255·d of an integer in [0, 255] (where the
    clamp does not already fix the byte)."""
    tol = 255 * d
    return (np.abs(value - np.round(value)) <= tol) & (value > -tol) & (value < 255 + tol)


def pipeline_bytes(latent: latent_space.LatentSpace, latents: jnp.ndarray) -> np.ndarray:
    """What ``dew.pipeline`` / ``python -m dew.sample`` write: ``to_images`` (the run's decode,
    in [−1, 1]), then the image artifact's uint8 (one column, no gutters), cut back into images."""
    images = latent.to_images(np.asarray(latents))
    grid = ImageGrid(images, columns=1).to_uint8_grid(scale=1, pad=0)
    return grid.reshape(images.shape)


def exact(golden, rule: str) -> np.ndarray:
    """The rule's value before the clamp and the cast, from the float64 decode (NHWC)."""
    y = golden["decoded64"].transpose(0, 2, 3, 1)
    if rule == "dit":
        return 127.5 * y + 128.0
    return 255.0 * ((y + 1.0) / 2.0)


def test_the_decoder_output_is_the_references_within_roundoff(golden):
    """dew's decode of the experiments' latents (unscaled by 0.18215) is diffusers' float64
    decode to ``DELTA``; the output spans beyond [−1, 1] on both sides, so the clamps matter."""
    latent = latent_run(golden, "dit.py:DiT-XL/2")
    y = np.asarray(latent.codec.decode_output(nhwc(golden["latents"])))
    want = golden["decoded64"].transpose(0, 2, 3, 1)
    assert np.abs(y - want).max() <= delta(golden), (np.abs(y - want).max(), delta(golden))
    assert (want < -1).mean() > 0.01 and (want > 1).mean() > 0.01


@pytest.mark.parametrize(("experiment", "rule"), [("dit.py:DiT-XL/2", "dit"), ("repa.py:SiT-XL/2", "repa")])
def test_pipeline_writes_the_references_bytes(golden, experiment, rule):
    """``dew.pipeline``'s images of a converted DiT (SiT shares dit.py's latent settings) or
    REPA run are ``sample_ddp.py``'s / ``generate.py``'s uint8 images."""
    latent = latent_run(golden, experiment)
    got = pipeline_bytes(latent, nhwc(golden["latents"]))
    assert_bytes(got, golden[f"{rule}/uint8"], exact(golden, rule), delta(golden))


@pytest.mark.parametrize(
    ("experiment", "preset"),
    [("dit.py:DiT-XL/2", "dit"), ("sit.py:SiT-XL/2", "sit"), ("repa.py:SiT-XL/2", "repa")],
)
def test_fid_presets_write_the_references_bytes(golden, experiment, preset):
    """``python -m dew.fid --preset=dit|sit|repa``'s ``to_uint8`` on the run's latents:
    DiT's and SiT's ``sample_ddp.py`` bytes, REPA's ``generate.py`` bytes."""
    latent = latent_run(golden, experiment)
    objective = types.SimpleNamespace(latent=latent)
    got = np.asarray(protocol_presets.OBJECTIVE_PRESETS[preset].to_uint8(objective, nhwc(golden["latents"])))
    rule = "repa" if preset == "repa" else "dit"
    assert_bytes(got, golden[f"{rule}/uint8"], exact(golden, rule), delta(golden))


def test_the_two_rules_differ_where_the_tolerance_cannot_hide_it(golden):
    """DiT's half-up and REPA's truncating rule differ by one on about half the bytes, far more
    than the ambiguous ones: a rounding mistake cannot pass as roundoff."""
    differ = golden["dit/uint8"] != golden["repa/uint8"]
    ambiguous = near_integer(exact(golden, "dit"), delta(golden))
    assert differ.mean() > 0.3 and ambiguous.mean() < 0.01


@pytest.mark.parametrize("experiment", ["dit.py:DiT-XL/2", "repa.py:SiT-XL/2"])
def test_the_encoder_sees_the_references_pixels(golden, experiment):
    """The raw latents (mean ‖ std) ``latent_dataset`` stores for these runs
    (``codec.encode_pixels``, ``--pixels=dit|repa``) are REPA's ``preprocessing/encoders.py``
    ``encode_pixels`` (uint8 / 127.5 − 1, diffusers' ``encode``) in float64, to 4 times PyTorch's
    own float32 deviation from it (9.6e-7 on values ≤ 1.6; dew measured 1.8e-6: another
    accumulation order)."""
    latent = latent_run(golden, experiment)
    got = np.asarray(latent.codec.encode_pixels(jnp.asarray(golden["encode/images"].transpose(0, 2, 3, 1))))
    want = golden["encode/raw64"].transpose(0, 2, 3, 1)
    bound = 4 * float(np.abs(golden["encode/raw"] - golden["encode/raw64"]).max())
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)
