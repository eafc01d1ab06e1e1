"""REPA (``dew.objectives.repa``, the ``interpolant`` objective's ``repa`` options) against
sihyun-yu/REPA's own code, on stored goldens (third_party/repa; no PyTorch here):

- the loss: ``SILoss`` (loss.py) on fixed images, a stand-in network and fixed encoder tokens,
  against ``repa.total_loss`` / ``repa.alignment_loss`` with dew's SiT transport (time mirrored);
- the encoder: REPA's DINOv2 path (``load_encoders``' timm resample of the position grid,
  ``preprocess_raw_image``, ``forward_features``' ``x_norm_patchtokens``) around the official
  dinov2 ViT at a tiny width, against ``dew.objectives.repa_encoders``'s pieces;
- the configuration: ``experiments/repa.py:SiT-*`` against ``train.py``'s own ``parse_args``
  (``args.json``);
- the objective: the encoder's weights are not trained parameters, the step's loss is the
  denoising term plus ``proj_coeff`` times the alignment term, and bad input is one line.
"""

from __future__ import annotations

import json
import pathlib

import haiku as hk
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from dew import pinned_weights, registry
from dew.config import apply_overrides, load_config
from dew.diffusion.transport import Transport
from dew.objectives import repa, repa_encoders
from dew.objectives.interpolant import Interpolant
from dew.schema import ConfigError
from dew.scoring import dinov2, dinov2_repa, dinov2_vitb14_weights
from dew.training.build import build_objective, open_split
from dew.training.objective import Step
from dew.training.trainer_config import resolve_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
HERE = ROOT / "third_party" / "repa"
U32 = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff, 2^-24
TINY = dinov2.ViTConfig(embed_dim=32, depth=2, num_heads=2, patch_size=14, mlp_ratio=4, train_grid=37)


def gamma(n: int) -> float:
    """γ_n = n·u / (1 − n·u): the relative error bound of n float32 roundings."""
    return n * U32 / (1 - n * U32)


@pytest.fixture(scope="module")
def siloss():
    with np.load(HERE / "siloss.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def dino():
    with np.load(HERE / "dinov2_repa.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


# --- the loss against SILoss --------------------------------------------------------------------


def _stand_in(g):
    """make_reference.py's stand-in network in REPA's time (NHWC here): v = a·x + t·b, projected
    tokens k = tanh(patches(x) @ w_k + t·u_k), patches in (c, p, q) order."""
    _, c, h, _ = g["x"].shape
    p = 2
    n_z = sum(1 for k in g if k.startswith("w"))

    def net(x, t):
        v = x * g["a"] + t.reshape(-1, 1, 1, 1) * g["b"]
        grid = h // p
        xc = x.transpose(0, 3, 1, 2).reshape(x.shape[0], c, grid, p, grid, p)
        patches = xc.transpose(0, 2, 4, 1, 3, 5).reshape(x.shape[0], grid * grid, -1)
        zs = [jnp.tanh(patches @ g[f"w{k}"] + t.reshape(-1, 1, 1) * g[f"u{k}"]) for k in range(n_z)]
        return v, zs

    return net, n_z


def _dew_side(g):
    """dew's total loss on SILoss's own draws: SiT time t' = 1 − t, network(x, t') = −v(x, 1 − t')."""
    net, n_z = _stand_in(g)

    def network(x, t_sit):
        v, zs = net(x, 1 - t_sit)
        return -v, zs

    x = jnp.asarray(g["x"].transpose(0, 2, 3, 1))
    noise = jnp.asarray(g["noise64"].transpose(0, 2, 3, 1).astype(np.float32))
    zs = [jnp.asarray(g[f"z{k}"]) for k in range(n_z)]
    transport = Transport.create("Linear", "velocity")
    fn = jax.jit(lambda x, t, e, zs: repa.total_loss(transport, network, x, t, e, zs, 0.5))
    return fn(x, 1 - jnp.asarray(g["t"]), noise, zs)


@pytest.mark.default_compiler
def test_total_loss_matches_siloss(siloss):
    """SILoss's ``denoising_loss.mean()``, ``proj_loss`` and train.py's ``loss_mean + 0.5 ·
    proj_loss_mean`` (float64 run of REPA's code) against dew in float32.

    Bounds: the alignment term's per-token cosine passes through a 16-long patch dot product, the
    t·u add and tanh (≈ 3 roundings), two norms and a dot of length D ≤ 20 (3·D), the mean over
    16 tokens and the sum over K·B = 6 terms of magnitude ≤ 1, and SiT's t' = 1 − t rounding
    (≤ 2u absolute on t, times |u_k| ≤ max|u| in the tanh argument) and the noise rounded once to
    float32 (one more rounding of x_t): γ_n·(1 + max|u|), n = 16 + 4 + 60 + 16 + 6.

    The denoising term is a mean of 256 squares of (pred − target); each residual is formed in
    ≈ 9 roundings (the float64 noise rounded to float32 included) on values ≤ |x| + |ε| + |b|:
    relative γ_{256+2·9}·scale with scale = mean((|pred| + |target|)²) over the golden's arrays."""
    loss, stats = _dew_side(siloss)
    max_u = max(float(np.abs(siloss[f"u{k}"]).max()) for k in range(2))
    proj_bound = gamma(16 + 4 + 60 + 16 + 6) * (1 + max_u)
    assert abs(float(stats["proj_loss"]) - float(siloss["proj_loss64"])) <= proj_bound
    t = siloss["t"].astype(np.float64)[:, None, None, None]
    x, e = siloss["x"].astype(np.float64), siloss["noise64"]
    pred = siloss["a"][None, :, None, None] * x + t * siloss["b"][None, :, None, None]
    scale = float(np.mean((np.abs(pred) + np.abs(e - x)) ** 2))
    den_bound = gamma(256 + 18) * scale
    assert abs(float(stats["denoising"]) - float(siloss["denoising64"].mean())) <= den_bound
    assert abs(float(loss) - float(siloss["total64"])) <= den_bound + 0.5 * proj_bound
    assert abs(float(siloss["proj_loss64"])) > 1e-3  # the case is not degenerate


def test_alignment_loss_normalises_per_token_and_means_over_tokens_then_examples():
    """SILoss's order: per example, the mean over tokens of −cos; summed over examples and
    encoders, divided by K·B. A zero token counts as cosine 0 (F.normalize's eps), so it lowers
    that example's mean; a per-token rescaling changes nothing."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 3, 5)).astype(np.float32)
    z_tilde = rng.standard_normal((2, 3, 5)).astype(np.float32)
    z[0, 1] = 0.0
    cos = np.sum(z * z_tilde, -1) / np.maximum(np.linalg.norm(z, axis=-1), 1e-12)
    cos /= np.linalg.norm(z_tilde, axis=-1)
    want = np.mean(-cos, axis=-1).sum() / 2
    got = float(repa.alignment_loss([jnp.asarray(z)], [jnp.asarray(z_tilde)]))
    assert abs(got - want) <= gamma(3 * 5 + 3 + 2) * 1.0
    scaled = z_tilde * rng.uniform(0.1, 10, (2, 3, 1)).astype(np.float32)
    assert abs(float(repa.alignment_loss([jnp.asarray(z)], [jnp.asarray(scaled)])) - want) <= 2 * gamma(25)


# --- DINOv2 as REPA uses it -----------------------------------------------------------------------------


def _dino_params(dino):
    weights = {k[len("weights/") :]: v for k, v in dino.items() if k.startswith("weights/")}
    params = dinov2.params_from_torch_names(weights, TINY)
    return dinov2_repa.resample_position_embeddings(params, TINY, 16)


def _aa_bound(in_size: int, out_size: int, magnitude: float) -> float:
    """Two separable antialiased-bicubic passes: dew computes them in float64 and rounds once
    (u·|v|·norm²); timm's float32 kernel rounds 2·taps products and sums, and its sample centres
    (≤ 2·in·u off, moving each renormalised weight by ≤ 2·(25/18)·δ)."""
    m = dinov2.antialiased_bicubic_matrix(in_size, out_size)
    taps = int((m != 0).sum(axis=1).max())
    norm = float(np.abs(m).sum(axis=1).max())
    torch_positions = 2 * taps * 2 * (25 / 18) * (2 * in_size * U32) * norm
    return (U32 + gamma(2 * taps) * norm) * norm * magnitude + torch_positions * magnitude


def _preprocess_bound(in_size: int, side: int) -> float:
    """dew's float32 ``repa_preprocess``: /255, −mean, /std (3 roundings) then two 4-tap bicubic
    products: γ_{4+4+3}·norm²·max|x| with max|x| = (1 − min mean)/min std."""
    m = dinov2.bicubic_matrix(in_size, side, side / in_size)
    norm = float(np.abs(m).sum(axis=1).max())
    magnitude = max(1 - min(dinov2.IMAGENET_MEAN), max(dinov2.IMAGENET_MEAN)) / min(dinov2.IMAGENET_STD)
    return gamma(11) * norm * norm * magnitude


@pytest.mark.default_compiler
def test_dinov2_tokens_match_repas_encoder(dino):
    """The position grid resampled as ``load_encoders`` does (timm, antialiased bicubic, 37 → 16),
    ``preprocess_raw_image`` (x/255, ImageNet mean/std, bicubic to 224 without antialias) on
    uint8 256² images, and the official ViT's ``x_norm_patchtokens`` (float64) against dew's
    ``repa_encoders`` pieces in float32. Each within its derived bound; the tokens within
    test_dinov2's ViT accumulation bound (257 tokens) plus the inputs' bounds. dinov2's own
    offset interpolation of the positions (2.9) or an antialiased resize (0.56 on the
    preprocessed values) fail it. (Resizing before or after the normalisation is the same map:
    the bicubic weights sum to 1.)"""
    params = _dino_params(dino)
    pos = np.asarray(params["dinov2"]["pos_embed"])
    magnitude = float(np.abs(dino["weights/pos_embed"]).max())
    pos_bound = _aa_bound(37, 16, magnitude)
    assert np.abs(pos - dino["pos_embed_resampled"]).max() <= pos_bound

    images = dino["images"].transpose(0, 2, 3, 1)
    x = jax.jit(dinov2_repa.repa_preprocess, static_argnums=1)(images, 224)
    got = np.asarray(x).transpose(0, 3, 1, 2).reshape(-1)[dino["preprocessed_index"]]
    pre_bound = _preprocess_bound(256, 224)
    assert np.abs(got - dino["preprocessed64"]).max() <= pre_bound

    tokens = jax.jit(lambda p, im: repa_encoders.dinov2_tokens(TINY, p, im))(params, images)
    want = dino["tokens64"]
    assert tokens.shape == want.shape == (2, 256, 32)
    d, h, n = 32, 128, 257
    per_block = d + d + d + h + d // 2 + 2 * n + 4 * d
    vit = gamma(3 * 14 * 14 + 2 * per_block + 2 * d) * float(np.abs(want).max())
    bound = vit + pos_bound + pre_bound
    assert np.abs(np.asarray(tokens) - want).max() <= bound, (np.abs(np.asarray(tokens) - want).max(), bound)


def test_repa_resolution_rules():
    """224·(resolution // 256): 256 tokens at 256², 1,024 at 512²; other sizes refused."""
    encoder = repa_encoders.representation_encoder("dinov2-vit-b")
    assert encoder.embed_dim == 768 and encoder.num_tokens((256, 256, 3)) == 256
    assert encoder.num_tokens((512, 512, 3)) == 1024
    with pytest.raises(ValueError, match="256x256 or 512x512"):
        encoder.num_tokens((64, 64, 3))
    assert (dinov2.VIT_B14.embed_dim, dinov2.VIT_B14.depth, dinov2.VIT_B14.num_heads) == (768, 12, 12)


def test_vitb14_weights_are_digest_checked(tmp_path):
    """The ViT-B/14 loader keeps dinov2_weights' pattern: a missing file names how to get it, an
    unpinned source is refused unless allowed, altered arrays are refused."""
    with pytest.raises(FileNotFoundError, match=r"dinov2_vitb14_pretrain\.pth"):
        dinov2_vitb14_weights.read_arrays(str(tmp_path / "missing.npz"))
    path = str(tmp_path / "w.npz")
    pinned_weights.write_npz(path, {"cls_token": np.zeros((1, 1, 4), np.float32)}, "ab" * 32)
    with pytest.raises(ValueError, match="not pinned"):
        dinov2_vitb14_weights.read_arrays(path)
    assert set(dinov2_vitb14_weights.read_arrays(path, allow_unpinned=True)) == {"cls_token"}


# --- the configuration against train.py's parse_args --------------------------------------------------


@pytest.mark.parametrize("size", ["SiT-B/2", "SiT-L/2", "SiT-XL/2"])
def test_imagenet_presets_are_repas_train_py(size):
    args = json.loads((HERE / "args.json").read_text())["train"]
    config = load_config(f"{ROOT / 'experiments' / 'repa.py'}:{size}")
    o, r = config.objective, config.objective.repa
    assert config.model.name == size and config.model.input_size == args["resolution"] // 8
    assert config.model.num_classes == args["num_classes"]
    assert config.model.class_dropout_prob == args["cfg_prob"]
    assert (o.path, o.prediction, o.loss_weight) == ("Linear", "velocity", None)
    assert (args["path_type"], args["prediction"], args["weighting"]) == ("linear", "v", "uniform")
    assert r.encoder == args["enc_type"] and r.encoder_depth == args["encoder_depth"]
    assert r.proj_coeff == args["proj_coeff"] and r.resolution == args["resolution"]
    assert r.projector_dim == 2048  # models/sit.py SiT(projector_dim=2048), not an argument
    assert config.dataset.batch_size == args["batch_size"]
    opt = config.optimizer
    assert (opt.learning_rate, opt.b1, opt.b2, opt.eps) == (
        args["learning_rate"],
        args["adam_beta1"],
        args["adam_beta2"],
        args["adam_epsilon"],
    )
    assert args["adam_weight_decay"] == 0 and opt.warmup_steps == 0 and opt.grad_clip == args["max_grad_norm"]
    assert config.ema.decay == 0.9999  # train.py's update_ema default
    assert config.train.num_steps == args["max_train_steps"] and config.seed == args["seed"]
    assert config.checkpoint.every == args["checkpointing_steps"]
    # sd-vae-ft-mse latents at train.py's latents_scale, the encoder on the images beside them
    latent = config.objective.latent
    assert latent.encoder == "stability_vae" and set(latent.raw_mean) == {0.0}
    assert {round(0.5 / s, 12) for s in latent.raw_std} == {0.18215}
    assert config.dataset.name == "latent_dataset" and r.image_field == "pixels"
    resolve_config(apply_overrides(config, []))  # every key is one the schema accepts


def test_recorded_sampling_is_the_readmes_generate_command():
    from importlib import util

    spec = util.spec_from_file_location("repa_experiment", ROOT / "experiments" / "repa.py")
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generate = json.loads((HERE / "args.json").read_text())["generate"]
    for key, value in module.REPA_SAMPLING.items():
        assert generate[key] == value, key
    # the presets sample with it: REPA's own sampler, every latent channel guided, the interval
    # mirrored into SiT's time
    import dew

    for size in module.IMAGENET_SIZES:
        config = load_config(f"{ROOT / 'experiments' / 'repa.py'}:{size}")
        s = config.objective.sampling
        sampler = dew.samplers[s.sampler]
        assert (sampler.kind, sampler.mode, sampler.heun) == (
            "repa_sampler",
            generate["mode"],
            generate["heun"],
        )
        assert (s.steps, s.cfg_scale) == (generate["num_steps"], generate["cfg_scale"])
        assert tuple(s.guidance_interval) == (1 - generate["guidance_high"], 1 - generate["guidance_low"])
        assert s.cfg_channels == 4 and generate["path_type"] == "linear" and config.objective.path == "Linear"


# --- the objective -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory):
    """Random ``image_encoder`` weights in the exported layout (as a contrastive run's)."""
    from dew.objectives.contrastive import ImageEncoder

    net = hk.without_apply_rng(hk.transform(lambda x: ImageEncoder(features=16, width=8)(x)))
    params = net.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    path = str(tmp_path_factory.mktemp("enc") / "encoder.npz")
    repa_encoders.export_image_encoder(params, path)
    return path


def digits_config(encoder_file, **overrides):
    config = load_config(f"{ROOT / 'experiments' / 'repa.py'}:digits")
    tiny = {
        "model.depth": 2,
        "model.hidden_size": 32,
        "model.num_heads": 2,
        "objective.repa.encoder_depth": 1,
        "objective.repa.projector_dim": 16,
        "objective.repa.encoder_weights": encoder_file,
        **overrides,
    }
    texts = [f"config.{k}={v}" if isinstance(v, str) else f"config.{k}={v!r}" for k, v in tiny.items()]
    return resolve_config(apply_overrides(config, texts))


def test_objective_trains_the_network_only_and_adds_the_weighted_alignment(encoder_file):
    config = digits_config(encoder_file)
    objective = build_objective(config, open_split(config.dataset, "train"))
    assert isinstance(objective, Interpolant) and objective.repa is not None
    assert objective.repa.embed_dim == 16 and objective.repa.num_tokens == 4
    images = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 1)), jnp.float32)
    batch = {"image": images, "label": jnp.arange(4, dtype=jnp.int32)}
    params = objective.init(jax.random.key(0), batch)
    names = set(params)
    assert any("projectors_0" in n for n in names)
    assert not any("image_encoder" in n for n in names)  # the frozen encoder is not trained
    params = jax.tree.map(lambda p: p + 0.05, params)  # off the zero-initialised adaLN / final layer
    step = Step(jnp.int32(0), is_training=False)
    loss, (stats, _) = jax.jit(lambda p, r, b: objective.loss(p, r, b, step))(
        params, jax.random.key(1), batch
    )
    assert float(stats["proj_loss"]) < 0.5 and np.isfinite(float(loss))
    np.testing.assert_allclose(
        float(loss), float(stats["denoising"]) + 0.5 * float(stats["proj_loss"]), rtol=4 * U32
    )
    # the denoising term is the plain transport loss on the same draws
    plain = build_objective(
        digits_config(encoder_file, **{"objective.repa.encoder": None}), objective_source()
    )
    plain_loss, _ = plain.loss(params, jax.random.key(1), batch, step)
    np.testing.assert_allclose(float(stats["denoising"]), float(plain_loss), rtol=64 * U32)
    # the alignment term's gradient reaches the projector and the blocks up to encoder_depth = 1,
    # and nothing after them (block 1, the final layer)
    grads = jax.grad(lambda p: objective.loss(p, jax.random.key(1), batch, step)[1][0]["proj_loss"])(params)

    def largest(part: str) -> float:
        leaves = [v for k, m in grads.items() if k.endswith(part) for v in jax.tree.leaves(m)]
        assert leaves, part
        return max(float(jnp.abs(v).max()) for v in leaves)

    assert largest("projectors_0_4") > 0 and largest("blocks_0/attn/qkv") > 0
    assert largest("final_layer/linear") == 0 and largest("blocks_1/attn/qkv") == 0


def objective_source():
    section = ml_collections.ConfigDict({"name": "digits", "batch_size": 128})
    return open_split(section, "train")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"objective.repa.encoder_depth": 3}, "config.objective.repa.encoder_depth=3 is beyond the network"),
        (
            {"objective.repa.encoder": "dinov3"},
            "config.objective.repa.encoder='dinov3' is unknown: expected one of",
        ),
        ({"objective.repa.proj_coeff": -0.5}, "proj_coeff"),
        ({"model.patch_size": 2}, "gives 4 tokens for image (8, 8, 1) but the network has 16"),
        ({"objective.repa.encoder": "dinov2-vit-b"}, "256x256 or 512x512"),
        ({"objective.repa.encoder": "class_label"}, "config.objective.repa.encoder='class_label' is unknown"),
    ],
)
def test_bad_input_is_one_line(encoder_file, overrides, message):
    with pytest.raises(ConfigError) as error:
        config = digits_config(encoder_file, **overrides)
        build_objective(config, open_split(config.dataset, "train"))
    text = str(error.value)
    assert message in text and "\n" not in text, text


def test_every_representation_encoder_is_registered():
    assert {"dinov2-vit-b", "dinov2-vit-l", "image_encoder"} <= set(repa_encoders.representation_encoders())
    assert "class_label" in registry.encoders.names()  # condition encoders share the table, not the kind


def test_training_steps_call_the_network_with_is_training_and_sampling_does_not():
    """SiT's ``model.train()``: the label embedder's class dropout is on in the training step (the
    network's ``is_training``), off when evaluating and sampling."""
    from dew.inputs import Condition, Field, InputSpec
    from dew.objectives.interpolant import Interpolant, Preview

    seen = []

    class Probe(hk.Module):
        def __call__(self, x, t, y, is_training=False):
            seen.append(is_training)
            return hk.get_parameter("scale", (), init=jnp.ones) * x

    spec = InputSpec(Field("x", (2,)), {"label": Condition("class_label", Field("label", (), "int32"), 3)})
    objective = Interpolant(spec, Transport.create(), Probe, num_classes=3, preview=Preview(steps=4))
    batch = {"x": jnp.ones((4, 2)), "label": jnp.zeros((4,), jnp.int32)}
    params = objective.init(jax.random.key(0), batch)
    seen.clear()
    objective.loss(params, jax.random.key(1), batch, Step(jnp.int32(0), is_training=True))
    objective.loss(params, jax.random.key(1), batch, Step(jnp.int32(0), is_training=False))
    assert seen == [True, False]


def test_the_imagenet_preset_trains_on_latents_with_the_images_beside(tmp_path):
    """``experiments/repa.py:SiT-B/2`` on a tiny ``latent_dataset`` whose images lie beside its
    latents (the test's own folder, ADM-center-cropped and encoded by a random tiny SD-VAE), with
    only the sizes shrunk: the network is built on the drawn latents, the encoder sees the uint8
    ``pixels`` at (0, 255), and the step's alignment term moves with the images, not the latents."""
    from test_latent_dataset import encode_with_images, tiny_codec

    from dew.data import Dataset
    from dew.networks.sd_vae_weights import save_safetensors, torch_state_dict
    from dew.objectives.contrastive import ImageEncoder

    codec = tiny_codec()
    latents, images = encode_with_images(tmp_path, codec)
    vae = str(tmp_path / "vae.safetensors")
    save_safetensors(vae, torch_state_dict(codec.params))
    net = hk.without_apply_rng(hk.transform(lambda x: ImageEncoder(features=16, width=8)(x)))
    encoder = str(tmp_path / "encoder.npz")
    repa_encoders.export_image_encoder(net.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3))), encoder)
    config = load_config(f"{ROOT / 'experiments' / 'repa.py'}:SiT-B/2")
    shrink = {
        "dataset.path": str(latents),
        "dataset.images": str(images),
        "dataset.batch_size": 2,
        "model.name": "sit",
        "model.depth": 2,
        "model.hidden_size": 32,
        "model.num_heads": 2,
        "model.patch_size": 2,
        "model.input_size": 8,
        "model.num_classes": 3,
        "objective.latent.weights": vae,
        "objective.latent.allow_unpinned": True,
        "objective.latent.vae_channels": (32, 64),
        "objective.latent.vae_layers_per_block": 1,
        "objective.latent.vae_groups": 8,
        "objective.repa.encoder": "image_encoder",
        "objective.repa.encoder_weights": encoder,
        "objective.repa.encoder_depth": 1,
        "objective.repa.projector_dim": 16,
        "objective.repa.resolution": None,
    }
    texts = [f"config.{k}={v}" if isinstance(v, str) else f"config.{k}={v!r}" for k, v in shrink.items()]
    config = resolve_config(apply_overrides(config, texts))
    source = open_split(config.dataset, "train")
    objective = build_objective(config, source)
    assert isinstance(objective, Interpolant) and objective.repa is not None
    assert objective.repa.image_field == "pixels" and objective.repa.value_range == (0.0, 255.0)
    batch = {k: jnp.asarray(v) for k, v in next(Dataset(source, 2, seed=0)).items()}
    assert batch["image"].shape == (2, 8, 8, 8) and batch["pixels"].dtype == jnp.uint8
    params = jax.tree.map(lambda p: p + 0.05, objective.init(jax.random.key(0), batch))
    step = Step(jnp.int32(0), is_training=True)
    loss = jax.jit(lambda p, b: objective.loss(p, jax.random.key(1), b, step)[1][0])
    stats = loss(params, batch)
    assert np.isfinite(float(stats["proj_loss"])) and np.isfinite(float(stats["denoising"]))
    other = loss(params, {**batch, "pixels": 255 - batch["pixels"]})
    assert float(other["denoising"]) == float(stats["denoising"])
    assert abs(float(other["proj_loss"]) - float(stats["proj_loss"])) > 1e-4
