"""dew's haiku ``AutoencoderKL`` and EDM2's latent scaling against diffusers' and NVlabs/edm2's own
code on a tiny random-weight VAE (goldens in third_party/sd_vae; no PyTorch here), the
safetensors reader and the weights' pinning."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.encoding import stability_vae
from dew.networks import sd_vae, sd_vae_weights

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

HERE = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "sd_vae"
U32 = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff, 2^-24
TINY = sd_vae.VAEConfig(block_out_channels=(32, 64), layers_per_block=1, latent_channels=4, norm_num_groups=8)


def _nchw(x):
    return np.asarray(x).transpose(0, 3, 1, 2)


def _nhwc(x):
    return np.asarray(x).transpose(0, 2, 3, 1)


@pytest.fixture(scope="module")
def reference():
    with np.load(HERE / "sd_vae_reference.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def torch_arrays(reference):
    """diffusers' state_dict (its own names and shapes, stored) filled from weights.py."""
    spec = importlib.util.spec_from_file_location("sd_vae_weights_gen", HERE / "weights.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    names = json.loads(str(reference["state_dict"]))
    return {k: gen.parameter(k, tuple(shape)) for k, shape in names.items()}


@pytest.fixture(scope="module")
def params(torch_arrays):
    return sd_vae.params_from_torch_names(torch_arrays, TINY)


def _path_length(config: sd_vae.VAEConfig, size: int, half: str) -> int:
    """Summed length of the accumulations on the path to one output value: 9·C_in per 3×3
    convolution, C_in per 1×1 one, and per GroupNorm twice its group size (mean, then variance)
    of (C/G)·H·W; the attention's q/k/v and output maps (C each), logits (C) and the softmax's
    normaliser and weighted sum over H·W tokens. γ_n·max|output| bounds float32's error then."""
    g = config.norm_num_groups

    def resnet(c_in, c, hw):
        n = 2 * (c_in // g) * hw * 2 + 9 * c_in + 9 * c
        return n + (c_in if c_in != c else 0)

    def mid(c, hw):
        return 2 * resnet(c, c, hw) + 2 * (c // g) * hw + 3 * c + c + 2 * hw + c

    chans = config.block_out_channels
    if half == "encoder":
        n, hw, c_prev = 9 * config.in_channels, size * size, chans[0]
        for i, c in enumerate(chans):
            for j in range(config.layers_per_block):
                n += resnet(c_prev if j == 0 else c, c, hw)
            c_prev = c
            if i < len(chans) - 1:
                n, hw = n + 9 * c, hw // 4
        return n + mid(chans[-1], hw) + 2 * (chans[-1] // g) * hw + 9 * chans[-1] + 2 * config.latent_channels
    rev = tuple(reversed(chans))
    hw = size * size
    n = config.latent_channels + 9 * config.latent_channels + mid(rev[0], hw)
    c_prev = rev[0]
    for i, c in enumerate(rev):
        for j in range(config.layers_per_block + 1):
            n += resnet(c_prev if j == 0 else c, c, hw)
        c_prev = c
        if i < len(rev) - 1:
            hw *= 4
            n += 9 * c
    return n + 2 * (rev[-1] // g) * hw + 9 * rev[-1]


def _gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def test_encoder_moments_match_diffusers_in_float64(reference, params):
    """edm2's ``encode_pixels`` input (uint8 / 255) through diffusers' ``AutoencoderKL.encode``
    in float64: dew's posterior mean and std (float32) lie within γ_n·max|value|, n the path's
    accumulation length (the std = exp(logvar/2) adds a relative ½·Δlogvar, covered by the same
    factor since std ≤ max). The asymmetric downsampling pad, GroupNorm ε, the attention scale or
    the logvar clamp each move outputs by > 1e-2."""
    codec = stability_vae.StabilityVAECodec(params, TINY)
    raw = _nchw(jax.jit(codec.encode_pixels)(_nhwc(reference["images"])))
    want = np.concatenate([reference["encoder/mean64"], reference["encoder/std64"]], axis=1)
    assert raw.shape == want.shape == (2, 8, 8, 8)
    assert np.std(want) > 0.3
    bound = _gamma(_path_length(TINY, 16, "encoder")) * np.abs(want).max()
    assert np.abs(raw - want).max() <= bound, (np.abs(raw - want).max(), bound)
    assert np.abs(reference["encoder/raw32"] - want).max() <= bound  # edm2's float32 run: same bound


def test_decoder_matches_diffusers_in_float64(reference, params):
    """diffusers' ``AutoencoderKL.decode`` (float64) on edm2's unscaled latents."""
    got = _nchw(jax.jit(sd_vae.decoder_network(TINY).apply)(params, _nhwc(reference["decoder/z"])))
    want = reference["decoder/sample64"]
    assert got.shape == want.shape == (2, 3, 16, 16)
    bound = _gamma(_path_length(TINY, 8, "decoder")) * np.abs(want).max()
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)


def test_decode_to_uint8_matches_edm2(reference, params):
    """edm2's ``decode`` (unscale, decoder, clamp(0, 1)·255, uint8 cast): dew gives the same bytes
    except where the float64 value lies within the float32 bound of an integer (a rounding tie)."""
    codec = stability_vae.StabilityVAECodec(params, TINY)
    got = _nchw(jax.jit(codec.decode)(_nhwc(reference["scaling/final"])))
    want = reference["decoder/pixels"]
    assert got.dtype == np.uint8 and got.shape == want.shape
    scaled = np.clip(reference["decoder/sample64"], 0, 1) * 255
    bound = 255 * _gamma(_path_length(TINY, 8, "decoder") + 8) * np.abs(reference["decoder/sample64"]).max()
    near_integer = np.abs(scaled - np.round(scaled)) <= bound
    assert np.all((got == want) | near_integer)
    assert np.mean(got == want) > 0.99 and len(np.unique(want)) > 50


def test_latent_scaling_is_edm2s(reference):
    """``StabilityVAEEncoder``'s constants give bit-identical float32 scale and bias, and
    ``encode_latents`` (mean + ε·std, then ·scale + bias) on edm2's raw latents and ε matches its
    output to 3 roundings of values ≤ max|·| (two products and a sum, each ≤ 1 ulp). Swapping
    raw_mean/raw_std, dropping the noise or using 0.18215 fails."""
    scaling = stability_vae.EDM2_SCALING
    np.testing.assert_array_equal(scaling.scale, reference["scaling/scale"])
    np.testing.assert_array_equal(scaling.bias, reference["scaling/bias"])
    raw, noise = _nhwc(reference["encoder/raw32"]), _nhwc(reference["scaling/noise"])
    got = _nchw(jax.jit(scaling.encode_latents)(raw, noise))
    want = reference["scaling/final"]
    mean, std = np.split(reference["encoder/raw32"], 2, axis=1)
    magnitude = (np.abs(mean) + np.abs(reference["scaling/noise"] * std)).max() * scaling.scale.max()
    bound = _gamma(4) * (magnitude + np.abs(scaling.bias).max())
    assert np.abs(got - want).max() <= bound, (np.abs(got - want).max(), bound)
    # unscale inverts it to the decoder's input edm2 computes
    z = _nchw(scaling.unscale(jnp.asarray(_nhwc(want))))
    assert np.abs(z - reference["decoder/z"]).max() <= _gamma(4) * np.abs(reference["decoder/z"]).max()


def test_encode_draws_noise_from_the_key(params):
    codec = stability_vae.StabilityVAECodec(params, TINY)
    pixels = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, 16, 16, 3), dtype=np.uint8))
    a = codec.encode(pixels, jax.random.PRNGKey(0))
    b = codec.encode(pixels, jax.random.PRNGKey(0))
    c = codec.encode(pixels, jax.random.PRNGKey(1))
    assert a.shape == (1, 8, 8, 4)
    np.testing.assert_array_equal(a, b)
    assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3


def test_safetensors_reader_matches_the_safetensors_package(reference):
    """A file written by safetensors itself (F32, F16, BF16): every tensor read back exactly."""
    tensors = sd_vae_weights.parse_safetensors(reference["safetensors/file"].tobytes())
    assert sorted(tensors) == ["bf16", "encoder.conv_in.weight", "f16", "f32"]
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, reference[f"safetensors/{name}"], err_msg=name)
    with pytest.raises(ValueError, match="not a safetensors file"):
        sd_vae_weights.parse_safetensors(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}", "x.safetensors")


def _write_safetensors(path, arrays):
    header, offset, blobs = {}, 0, []
    for name, a in arrays.items():
        b = np.ascontiguousarray(a, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_weights_file_is_refused_unpinned_and_old_attention_names_load(tmp_path, torch_arrays, params):
    """A safetensors file with the pre-rename attention names (query/key/value/proj_attn, as old
    diffusers checkpoints have) loads to the same params; it is refused unless allowed, since no
    digest is pinned; a missing file is one line naming it and how to get it."""
    old = {}
    for k, v in torch_arrays.items():
        for new, dep in (("to_q", "query"), ("to_k", "key"), ("to_v", "value"), ("to_out.0", "proj_attn")):
            k = k.replace(f".attentions.0.{new}.", f".attentions.0.{dep}.")
        old[k] = v
    assert any(".proj_attn." in k for k in old)
    path = tmp_path / sd_vae_weights.SOURCE_NAME
    _write_safetensors(path, old)
    with pytest.raises(ValueError, match="not pinned"):
        sd_vae_weights.load_weights(str(path), config=TINY)
    loaded = sd_vae_weights.load_weights(str(path), allow_unpinned=True, config=TINY)
    assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    missing = tmp_path / "absent.safetensors"
    with pytest.raises(FileNotFoundError) as e:
        sd_vae_weights.load_weights(str(missing))
    message = str(e.value)
    assert "\n" not in message and str(missing) in message and "stabilityai/sd-vae-ft-mse" in message


def test_mapping_names_what_is_wrong(torch_arrays):
    bad = dict(torch_arrays)
    del bad["decoder.conv_out.bias"]
    with pytest.raises(KeyError, match="decoder__conv_out"):
        sd_vae.params_from_torch_names(bad, TINY)
    bad = dict(torch_arrays, **{"encoder.conv_in.weight": np.zeros((32, 3, 5, 5), np.float32)})
    with pytest.raises(ValueError, match="encoder__conv_in"):
        sd_vae.params_from_torch_names(bad, TINY)
    with pytest.raises(ValueError, match="hold modules"):
        sd_vae.params_from_torch_names(dict(torch_arrays, **{"extra.conv.weight": np.zeros(3)}), TINY)


def test_sd_vae_ft_mse_shapes():
    """The default config is sd-vae-ft-mse's: 83,653,863 parameters in all (diffusers' count for
    AutoencoderKL with block_out_channels (128, 256, 512, 512), 2 layers, 4 latents, 32 groups)."""
    shapes = sd_vae.expected_shapes(sd_vae.SD_VAE)
    total = sum(int(np.prod(s)) for leaves in shapes.values() for s in leaves.values())
    assert total == 83_653_863
    assert shapes["encoder__conv_out"]["w"] == (3, 3, 512, 8)
    assert shapes["decoder__up_blocks__3__resnets__2__conv2"]["w"] == (3, 3, 128, 128)
