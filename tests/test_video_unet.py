"""The video U-Net's (2+1)-D convolution against XLA's own 3-D convolution, and the frame order
reaching the temporal attention."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew.networks.video_unet import Conv2Plus1D, FactorisedAttention, TemporalConv, VideoUNet


def _clips(shape: tuple[int, ...], seed: int = 0) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def test_temporal_conv_is_a_3x1x1_convolution_zero_padded_in_time():
    x = _clips((2, 5, 3, 4, 6))
    f = hk.without_apply_rng(hk.transform(lambda x: TemporalConv(7, name="t")(x)))
    params = f.init(jax.random.PRNGKey(1), x)
    params = jax.tree.map(lambda p: p + 0.1, params)  # a non-zero bias too
    w, b = params["t"]["w"], params["t"]["b"]
    reference = jax.lax.conv_general_dilated(
        x,
        w[:, None, None],
        (1, 1, 1),
        [(1, 1), (0, 0), (0, 0)],
        dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
    )
    ours = f.apply(params, x)
    # Both sum 3·6 = 18 float32 products per output: |error| <= γ_18 Σ|x w| (Higham), γ_n ≈ n·2^-24.
    bound = (
        18
        * 2.0**-24
        * jax.lax.conv_general_dilated(
            jnp.abs(x),
            jnp.abs(w)[:, None, None],
            (1, 1, 1),
            [(1, 1), (0, 0), (0, 0)],
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
        )
    )
    np.testing.assert_array_less(np.abs(ours - (reference + b)), 2 * np.asarray(bound) + 1e-30)


def test_conv_2plus1d_mixes_a_frame_only_with_its_neighbours():
    x = _clips((1, 6, 8, 8, 2))
    f = hk.without_apply_rng(hk.transform(lambda x: Conv2Plus1D(4, name="c")(x)))
    params = f.init(jax.random.PRNGKey(2), x)
    grads = jax.grad(lambda x: f.apply(params, x)[0, 3].sum())(x)  # output frame 3
    touched = np.abs(np.asarray(grads[0])).reshape(6, -1).max(axis=1) > 0
    np.testing.assert_array_equal(touched, [False, False, True, True, True, False])


def test_temporal_attention_knows_the_frame_order():
    """Without a frame embedding, attention over time is permutation-equivariant: a reversed
    clip would give the reversed output and the network could not tell forward from backward."""
    x = _clips((1, 4, 2, 2, 8))
    f = hk.without_apply_rng(hk.transform(lambda x: FactorisedAttention(name="a")(x)))
    params = f.init(jax.random.PRNGKey(3), x)
    params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.PRNGKey(4), p.shape), params)
    forward = f.apply(params, x)
    backward = f.apply(params, x[:, ::-1])[:, ::-1]
    assert float(jnp.max(jnp.abs(forward - backward))) > 1e-3
    without = jax.tree.map(lambda p: p, params)
    without["a"]["frame_embedding"] = jnp.zeros_like(params["a"]["frame_embedding"])
    np.testing.assert_allclose(
        f.apply(without, x), f.apply(without, x[:, ::-1])[:, ::-1], rtol=1e-5, atol=1e-5
    )


def test_the_two_level_network_maps_clips_to_clips_through_its_spatial_down_and_up_sampling():
    """Shapes only (traced, not compiled): two levels halve 16x16 to 8x8 at 2x the channels and
    back, keep all 8 frames, and the temporal attention at 8x8 embeds the 8 frame indices."""
    net = hk.transform(lambda x, s, y: VideoUNet(8, (1, 2), 1)(x, s, label=y))
    x, s, y = (jax.ShapeDtypeStruct(shape, jnp.float32) for shape in ((2, 8, 16, 16, 1), (2,), (2, 10)))
    params = jax.eval_shape(net.init, jax.random.PRNGKey(0), x, s, y)
    assert jax.eval_shape(net.apply, params, None, x, s, y).shape == (2, 8, 16, 16, 1)
    assert params["video_u_net/down0"]["w"].shape == (3, 3, 8, 8)  # stride 2 at 16x16
    assert params["video_u_net/up1"]["w"].shape == (3, 3, 16, 16)  # after the 8x8 level
    assert params["video_u_net/mid_attn"]["frame_embedding"].shape == (8, 16)
