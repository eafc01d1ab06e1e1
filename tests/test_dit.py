"""dew's DiT / SiT (dew.networks.dit) against the references' own network code on random weights
(goldens in third_party/dit): facebookresearch/DiT and willisma/SiT ``models.py``, sihyun-yu/REPA
``models/sit.py`` (make_reference.py), hustvl/LightningDiT's options and Gsunshine/meanflow's
flax DiT with the second time input (make_meanflow_reference.py).

Float32 bounds: each output is a chain of at most 12 matrix products/reductions (patch
embedding, timestep MLP ×2, per block qkv, attention q·k and p·v, proj, fc1, fc2, adaLN; final
adaLN and linear) of length K ≤ 256. Rounding errors of a length-K product grow as λ·√K·u
(u = 2⁻²⁴, float32 unit roundoff; Higham & Mary 2019's probabilistic bound, λ = 4 holds with
probability > 0.999), so |dew − reference| ≤ 4 · 12 · √256 · u · max|reference| elementwise
(softmax, LayerNorm and GELU are well-conditioned at these unit-scale activations and add O(u)).
The worst-case K·u bound would be 16× looser and would not see GELU's tanh approximation dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import registry
from dew.interop.dit_checkpoint import convert_state_dict
from dew.networks import dit_layers
from dew.networks.dit import check_options
from dew.schema import ConfigError

GOLDEN = Path(__file__).resolve().parents[1] / "third_party" / "dit"
U = 2.0**-24
BOUND_FACTOR = 4 * 12 * 16  # λ · products · √K


def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(GOLDEN / f"{name}.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def bound(reference: np.ndarray) -> float:
    return BOUND_FACTOR * U * float(np.max(np.abs(reference)))


def nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def tiny(config: dict, model: str = "dit", **extra) -> dict:
    options = dict(
        depth=config["depth"],
        hidden_size=config["hidden_size"],
        num_heads=config["num_heads"],
        patch_size=config["patch_size"],
        num_classes=config["num_classes"],
        class_dropout_prob=config["class_dropout_prob"],
        **extra,
    )
    if "learn_sigma" in config:
        options["learn_sigma"] = config["learn_sigma"]
    return options


def apply(model: str, options: dict, params, *args, method: str | None = None, **kwargs):
    def f(*a, **k):
        net = registry.models[model](**options)
        return (getattr(net, method) if method else net)(*a, **k)

    return hk.transform(f).apply(params, None, *args, **kwargs)


def reference_params(state: dict[str, np.ndarray]):
    return jax.tree.map(jnp.asarray, convert_state_dict(state))


@pytest.mark.default_compiler
def test_dit_matches_reference_forward_drop_ids_and_cfg():
    ref = golden("dit_tiny")
    with np.load(GOLDEN / "dit_tiny_state_dict.npz", allow_pickle=False) as data:
        state = {k: data[k] for k in data.files}
    config = json.loads(str(ref["config_json"]))
    options = tiny(config)
    params = reference_params(state)
    x, t, y = nhwc(ref["x"]), ref["t"], ref["y"].astype(np.int32)

    out = apply("dit", options, params, x, t, y)
    assert out.shape == (4, 8, 8, 8)  # learn_sigma: 2C channels
    np.testing.assert_allclose(out, nhwc(ref["out"]), atol=bound(ref["out"]), rtol=0)

    dropped = apply("dit", options, params, x, t, y, force_drop_ids=ref["force_drop_ids"].astype(np.int32))
    np.testing.assert_allclose(dropped, nhwc(ref["out_dropped"]), atol=bound(ref["out_dropped"]), rtol=0)

    cfg = apply(
        "dit",
        options,
        params,
        nhwc(ref["cfg_x"]),
        ref["cfg_t"],
        ref["cfg_y"].astype(np.int32),
        float(ref["cfg_scale"]),
        method="forward_with_cfg",
    )
    # cond − uncond is scaled by 4: the bound grows by (1 + 2·4) on the guided channels.
    np.testing.assert_allclose(cfg, nhwc(ref["cfg_out"]), atol=9 * bound(ref["cfg_out"]), rtol=0)


@pytest.mark.default_compiler
def test_sit_matches_reference_forward_and_cfg():
    ref = golden("sit_tiny")
    state = {k[len("param/") :]: v for k, v in ref.items() if k.startswith("param/")}
    config = json.loads(str(ref["config_json"]))
    params = reference_params(state)
    options = tiny(config)
    x, t, y = nhwc(ref["x"]), ref["t"], ref["y"].astype(np.int32)
    out = apply("sit", options, params, x, t, y)
    assert out.shape == (4, 8, 8, 4)  # learn_sigma built, the σ half dropped
    np.testing.assert_allclose(out, nhwc(ref["out"]), atol=bound(ref["out"]), rtol=0)
    cfg = apply(
        "sit",
        options,
        params,
        nhwc(ref["cfg_x"]),
        ref["cfg_t"],
        ref["cfg_y"].astype(np.int32),
        float(ref["cfg_scale"]),
        method="forward_with_cfg",
    )
    np.testing.assert_allclose(cfg, nhwc(ref["cfg_out"]), atol=9 * bound(ref["cfg_out"]), rtol=0)


@pytest.mark.default_compiler
def test_repa_projector_features_match_reference():
    ref = golden("repa_tiny")
    config = json.loads(str(ref["config_json"]))
    state = {k[len("param/") :]: v for k, v in ref.items() if k.startswith("param/")}
    options = tiny(
        config,
        learn_sigma=False,
        encoder_depth=config["encoder_depth"],
        projector_dims=tuple(config["z_dims"]),
        projector_hidden=config["projector_dim"],
    )
    params = reference_params(state)
    x, t, y = nhwc(ref["x"]), ref["t"], ref["y"].astype(np.int32)
    out, (z0, z1) = apply("sit", options, params, x, t, y, return_features=True)
    np.testing.assert_allclose(out, nhwc(ref["out"]), atol=bound(ref["out"]), rtol=0)
    # The projectors add three products (K ≤ 64) after block encoder_depth.
    for mine, theirs in ((z0, ref["z0"]), (z1, ref["z1"])):
        np.testing.assert_allclose(mine, theirs, atol=bound(theirs), rtol=0)


@pytest.mark.default_compiler
@pytest.mark.parametrize(
    "name, options",
    [
        ("lightningdit_tiny", dict(norm="rmsnorm", mlp="swiglu", qk_norm=True, rotary=True)),
        ("lightningdit_tiny_layernorm_qk", dict(qk_norm=True, rotary=True)),
    ],
)
def test_lightningdit_options_match_reference(name, options):
    """RMSNorm, QK-norm (RMSNorm per head; timm's affine LayerNorm without RMSNorm), SwiGLU and
    2-D rotary positions, against hustvl/LightningDiT's own ``LightningDiT``; its rotary tables
    against dew's."""
    ref = golden(name)
    config = json.loads(str(ref["config_json"]))
    state = {k[len("param/") :]: v for k, v in ref.items() if k.startswith("param/")}
    cos, sin = dit_layers.rotary_tables(config["hidden_size"] // config["num_heads"], 4)
    np.testing.assert_allclose(cos, state["feat_rope.freqs_cos"], atol=4 * U, rtol=0)
    np.testing.assert_allclose(sin, state["feat_rope.freqs_sin"], atol=4 * U, rtol=0)
    params = reference_params(state)
    out = apply("dit", tiny(config, **options), params, nhwc(ref["x"]), ref["t"], ref["y"].astype(np.int32))
    np.testing.assert_allclose(out, nhwc(ref["out"]), atol=bound(ref["out"]), rtol=0)


def meanflow_module(path: str) -> tuple[str, str]:
    """Gsunshine/meanflow's flax path -> (dew module, parameter): ``blocks/layers_0/attn/qkv/
    _flax_linear/kernel`` -> (``dit/blocks_0/attn/qkv``, ``weight``); flax's Dense kernels are
    [in, out] and its convolution HWIO, dew's layouts."""
    parts = [p for p in path.split("/") if p not in ("_flax_linear", "_flax_embedding")]
    merged: list[str] = []
    for part in parts[:-1]:
        if part.startswith("layers_") and merged:
            merged[-1] += "_" + part[len("layers_") :]
        else:
            merged.append(part)
    return "/".join(["dit", *merged]), {"kernel": "weight", "embedding": "weight"}.get(parts[-1], parts[-1])


@pytest.mark.default_compiler
def test_meanflow_dit_matches_reference():
    """``time_inputs=("t", "h")`` against Gsunshine/meanflow's own flax DiT (c = t_emb + h_emb +
    y_emb), built as its ``meanflow.py`` builds it: no label dropout, the null row kept."""
    ref = golden("meanflow_dit_tiny")
    config = json.loads(str(ref["config_json"]))
    params: dict = {}
    for key, value in ref.items():
        if key.startswith("param/"):
            module, name = meanflow_module(key[len("param/") :])
            params.setdefault(module, {})[name] = jnp.asarray(value, jnp.float32)
    options = tiny(config, time_inputs=("t", "h"), null_class=True)
    out = apply("dit", options, params, ref["x"], ref["t"], ref["y"], h=ref["h"])
    np.testing.assert_allclose(out, ref["out"], atol=bound(ref["out"]), rtol=0)


def _count(model: str, size: int = 32, **options) -> int:
    def init(x, t, y):
        return registry.models[model](**options)(x, t, y)

    shapes = jax.eval_shape(
        hk.transform(init).init,
        jax.random.PRNGKey(0),
        jnp.zeros((1, size, size, 4)),
        jnp.zeros(1),
        jnp.zeros(1, jnp.int32),
    )
    return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(shapes))


def test_parameter_counts_of_every_published_size():
    counts = json.loads((GOLDEN / "parameter_counts.json").read_text())
    assert counts["DiT-XL/2"]["total"] == 675_129_632
    for size in ("S", "B", "L", "XL"):
        for patch in (2, 4, 8):
            name = f"DiT-{size}/{patch}"
            hidden = {"S": 384, "B": 768, "L": 1024, "XL": 1152}[size]
            ours = _count(name)
            assert ours == counts[name]["trainable"], name
            # The reference also counts its fixed pos_embed [1, (32/p)², D]; dew computes it.
            assert ours + (32 // patch) ** 2 * hidden == counts[name]["total"], name
    assert _count("SiT-XL/2") == counts["SiT-XL/2"]["trainable"]
    repa = _count("SiT-XL/2", learn_sigma=False, encoder_depth=8, projector_dims=(768,))
    assert repa == counts["REPA SiT-XL/2"]["trainable"]


def test_registered_sizes_and_config_fields():
    for size, (depth, hidden, heads) in {"S": (12, 384, 6), "XL": (28, 1152, 16)}.items():
        factory = registry.models[f"SiT-{size}/4"]
        assert factory.keywords == {
            "depth": depth,
            "hidden_size": hidden,
            "num_heads": heads,
            "patch_size": 4,
            "sigma_output": False,
        }
    # The generic entries take the size from config fields.
    assert _count("dit", depth=12, hidden_size=384, num_heads=6, patch_size=2) == _count("DiT-S/2")


def _tiny_net(**options):
    base = dict(depth=2, hidden_size=32, num_heads=4, patch_size=2, num_classes=5)
    return lambda *a, **k: registry.models["dit"](**{**base, **options})(*a, **k)


def test_second_time_input_is_a_summed_embedder():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 3))
    t, h, y = jnp.array([0.2, 0.7]), jnp.array([0.1, 0.0]), jnp.array([1, 4])
    with_h = hk.transform(_tiny_net(time_inputs=("t", "h")))
    plain = hk.transform(_tiny_net())
    params = with_h.init(jax.random.PRNGKey(1), x, t, y, h=h)
    assert {"dit/h_embedder/mlp_0", "dit/h_embedder/mlp_2"} <= set(params)
    # Non-zero modulation weights so the conditioning reaches the output.
    params = jax.tree.map(lambda a: a + 0.05 * jnp.ones_like(a), params)
    out = with_h.apply(params, None, x, t, y, h=h)
    assert not np.allclose(out, with_h.apply(params, None, x, t, y, h=h + 0.3))
    # With the h MLP's output layer zero, h contributes nothing: c = t_emb + 0 + y_emb.
    silent = {**params, "dit/h_embedder/mlp_2": jax.tree.map(jnp.zeros_like, params["dit/h_embedder/mlp_2"])}
    without = {k: v for k, v in params.items() if not k.startswith("dit/h_embedder")}
    np.testing.assert_allclose(
        with_h.apply(silent, None, x, t, y, h=h), plain.apply(without, None, x, t, y), atol=1e-6, rtol=0
    )
    with pytest.raises(ValueError, match=r"h=None with time_inputs=\('t', 'h'\)"):
        with_h.apply(params, None, x, t, y)
    with pytest.raises(ValueError, match="h=given"):
        plain.apply(without, None, x, t, y, h=h)


def test_label_dropout_in_training_uses_the_null_class():
    x = jnp.zeros((64, 4, 4, 3))
    t, y = jnp.zeros(64), jnp.zeros(64, jnp.int32)
    net = hk.transform(_tiny_net(class_dropout_prob=0.25))
    params = net.init(jax.random.PRNGKey(0), x, t, y)
    assert params["dit/y_embedder/embedding_table"]["weight"].shape == (6, 32)  # 5 classes + null
    params = jax.tree.map(lambda a: a + 0.05 * jax.random.normal(jax.random.PRNGKey(3), a.shape), params)
    train = net.apply(params, jax.random.PRNGKey(2), x, t, y, is_training=True)
    cond = net.apply(params, None, x, t, y)
    null = net.apply(params, None, x, t, y, force_drop_ids=jnp.ones(64, jnp.int32))
    is_null = np.all(np.isclose(train, null, atol=1e-6), axis=(1, 2, 3))
    is_cond = np.all(np.isclose(train, cond, atol=1e-6), axis=(1, 2, 3))
    # Binomial(64, 0.25): mean 16, sd 3.5; 4..28 is ±3.4 sd.
    assert np.all(is_null ^ is_cond) and 4 <= is_null.sum() <= 28
    # MeanFlow drops labels itself (class_dropout_prob=0) and keeps the null row.
    for null_class, rows in ((None, 5), (True, 6)):
        kept = hk.transform(_tiny_net(class_dropout_prob=0.0, null_class=null_class))
        shapes = jax.eval_shape(kept.init, jax.random.PRNGKey(0), x, t, y)
        assert shapes["dit/y_embedder/embedding_table"]["weight"].shape == (rows, 32)


@pytest.mark.parametrize(
    "remat, mlp",
    [
        ("blocks", "gelu_tanh"),
        ("blocks_save_mlp", "gelu_tanh"),
        ("blocks_save_mlp", "swiglu"),
        ("blocks_save_products", "gelu_tanh"),
    ],
)
def test_remat_is_the_same_function(remat, mlp):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 3))
    t, y = jnp.array([0.2, 0.7]), jnp.array([1, 4])
    plain, remat = hk.transform(_tiny_net(mlp=mlp)), hk.transform(_tiny_net(remat=remat, mlp=mlp))
    params = plain.init(jax.random.PRNGKey(1), x, t, y)
    params = jax.tree.map(lambda a: a + 0.05 * jax.random.normal(jax.random.PRNGKey(3), a.shape), params)

    def loss(net, p):
        return jnp.sum(jnp.square(net.apply(p, None, x, t, y)))

    g_plain, g_remat = jax.grad(lambda p: loss(plain, p))(params), jax.grad(lambda p: loss(remat, p))(params)
    for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_remat), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_save_mlp_keeps_each_blocks_feed_forward_and_recomputes_the_rest():
    """What the backward pass keeps (the residuals of ``jax.vjp``): ``blocks_save_mlp`` keeps, per
    block, the feed-forward's hidden pre-activation [B, T, 4·D] and its output [B, T, D] (the
    adaLN gate's gradient reads it) beyond what ``blocks`` keeps (each block's input);
    ``blocks_save_products`` keeps q, k and v [B, T, N, H] as well; without remat the
    feed-forward's activations are all kept (fc1's output and its GELU, at least)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 3))
    t, y = jnp.array([0.2, 0.7]), jnp.array([1, 4])
    depth, tokens, width = 2, 4, 32  # T = (4/2)² tokens of D = 32

    def kept(remat: str) -> tuple[int, int, int]:
        net = hk.transform(_tiny_net(depth=depth, remat=remat))
        params = net.init(jax.random.PRNGKey(1), x, t, y)
        _, backward = jax.vjp(lambda p: net.apply(p, None, x, t, y), params)
        shapes = [r.shape for r in jax.tree.leaves(backward)]
        heads = (2, tokens, 4, width // 4)  # q, k or v: [B, T, N, H]
        return shapes.count((2, tokens, 4 * width)), shapes.count((2, tokens, width)), shapes.count(heads)

    blocks, mlp, products = kept("blocks"), kept("blocks_save_mlp"), kept("blocks_save_products")
    assert blocks[0] == 0 and mlp[0] == depth and products[0] == depth
    assert mlp[1] - blocks[1] == depth and products[1] - blocks[1] == depth
    assert blocks[2] == mlp[2] == 0 and products[2] == 3 * depth
    assert kept("none")[0] >= 2 * depth


def test_bad_input_is_one_line():
    x = jnp.zeros((1, 6, 6, 4))
    with pytest.raises(ConfigError, match=r"patch_size=4 does not divide the latent resolution 6x6"):
        hk.transform(_tiny_net(patch_size=4)).init(
            jax.random.PRNGKey(0), x, jnp.zeros(1), jnp.zeros(1, jnp.int32)
        )
    with pytest.raises(ConfigError, match=r"patch_size=3 does not divide input_size=32"):
        check_options(depth=2, hidden_size=32, num_heads=4, patch_size=3, input_size=32)
    with pytest.raises(ConfigError, match=r"encoder_depth=9 is beyond the network: expected 1..depth=2"):
        hk.transform(_tiny_net(encoder_depth=9)).init(jax.random.PRNGKey(0), x, jnp.zeros(1), jnp.zeros(1))
    with pytest.raises(ConfigError, match=r"remat='all' is invalid: expected one of \('none', 'blocks'"):
        check_options(depth=2, hidden_size=32, num_heads=4, patch_size=2, remat="all")
    with pytest.raises(ConfigError, match=r"time_inputs=\('h',\) is invalid"):
        hk.transform(_tiny_net(time_inputs=("h",))).init(jax.random.PRNGKey(0), x, jnp.zeros(1), jnp.zeros(1))


def test_lightningdit_options_name_their_parameters_as_the_reference():
    x = jnp.zeros((1, 4, 4, 3))
    net = hk.transform(_tiny_net(norm="rmsnorm", mlp="swiglu", qk_norm=True, rotary=True))
    params = jax.eval_shape(net.init, jax.random.PRNGKey(0), x, jnp.zeros(1), jnp.zeros(1, jnp.int32))
    block = {
        k[len("dit/blocks_0/") :]: {n: a.shape for n, a in v.items()}
        for k, v in params.items()
        if k.startswith("dit/blocks_0/")
    }
    hidden = int(2 / 3 * 4 * 32)  # LightningDiT: SwiGLUFFN(D, int(2/3 · mlp_hidden_dim))
    assert block == {
        "adaLN_modulation_1": {"weight": (32, 192), "bias": (192,)},
        "norm1": {"weight": (32,)},
        "norm2": {"weight": (32,)},
        "attn/qkv": {"weight": (32, 96), "bias": (96,)},
        "attn/q_norm": {"weight": (8,)},
        "attn/k_norm": {"weight": (8,)},
        "attn/proj": {"weight": (32, 32), "bias": (32,)},
        "mlp/w12": {"weight": (32, 2 * hidden), "bias": (2 * hidden,)},
        "mlp/w3": {"weight": (hidden, 32), "bias": (32,)},
    }
    assert params["dit/final_layer/norm_final"]["weight"].shape == (32,)


def test_rotary_tables_rotate_pairs_by_row_then_column():
    cos, sin = dit_layers.rotary_tables(head_dim=8, grid_size=3)
    assert cos.shape == (9, 8)
    # Token (i, j) = i·3 + j: channels 0..3 turn with the row i, 4..7 with the column j, each
    # frequency shared by an interleaved pair; frequencies 1 and 1/100 (theta^(-k/2), dim 4).
    angles = np.array([[i, i, i / 100, i / 100, j, j, j / 100, j / 100] for i in range(3) for j in range(3)])
    np.testing.assert_allclose(cos, np.cos(angles), atol=1e-6)
    np.testing.assert_allclose(sin, np.sin(angles), atol=1e-6)
    q = jax.random.normal(jax.random.PRNGKey(0), (1, 9, 2, 8))
    rotated = dit_layers.apply_rotary(q, cos, sin)
    np.testing.assert_allclose(rotated[:, 0], q[:, 0], atol=1e-6)  # position (0, 0) is not turned
    np.testing.assert_allclose(jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(q, axis=-1), rtol=1e-5)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"conditioning": "in_context", "time_inputs": ("t", "h")}, "time_inputs"),
        ({"conditioning": "in_context", "time_inputs": ("h",), "norm": "rmsnorm"}, "norm"),
        ({"conditioning": "in_context", "time_inputs": ("h",), "head_depth": 3}, "head_depth"),
        ({"v_head": True}, "v_head"),
        ({"conditioning": "cross"}, "conditioning"),
    ],
)
def test_in_context_options_are_checked_in_one_line(options, field):
    """iMF's options (conditioning='in_context', v_head, head_depth) refuse what they cannot build."""
    from dew.networks.dit import check_options

    with pytest.raises(ConfigError, match=f"{field}="):
        check_options(depth=2, hidden_size=32, num_heads=4, patch_size=2, **options)
