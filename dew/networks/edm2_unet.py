"""EDM2's U-Net (Karras et al. 2024, Figure 21) exactly as NVlabs/edm2 ``training/networks_edm2.py``
builds it (``Block`` and ``UNet``), in haiku and channels-last. Registered as
``dew.models["edm2unet"]``: F(x, c_noise; label) for dew's ``diffusion`` objective with the EDM
preset (whose c_in, c_skip, c_out and c_noise = ln σ / 4 are the reference ``Precond``'s). The
whole ``Precond`` with its log-variance head is ``dew.networks.edm2_precond``.

Module names are the reference's ModuleDict keys with ``.`` → ``_`` at the dict level:
``unet.enc.64x64_block0.conv_res0.weight`` is ``<net>/enc_64x64_block0/conv_res0``'s ``weight``
(the full table: ``dew.networks.edm2_weights``).
"""

from __future__ import annotations

from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.networks.dropout import dropout as apply_dropout
from dew.networks.edm2_layers import MPConv, MPFourier, mp_cat, mp_silu, mp_sum, normalize, resample
from dew.networks.edm_inputs import check_choice, embed_conditions


class Block(hk.Module):
    """U-Net encoder/decoder block with optional cosine self-attention (Figure 21), the
    reference's ``Block``; ``in_channels`` is read from the input."""

    def __init__(
        self,
        out_channels: int,
        flavor: str = "enc",
        resample_mode: str = "keep",
        resample_filter: Sequence[int] = (1, 1),
        attention: bool = False,
        channels_per_head: int = 64,
        dropout: float = 0.0,
        res_balance: float = 0.3,
        attn_balance: float = 0.3,
        clip_act: float | None = 256,
        name: str | None = None,
    ):
        super().__init__(name=name)
        check_choice("Block", "flavor", flavor, ("enc", "dec"))
        check_choice("Block", "resample_mode", resample_mode, ("keep", "up", "down"))
        self.out_channels, self.flavor = out_channels, flavor
        self.resample_mode, self.resample_filter = resample_mode, tuple(resample_filter)
        self.num_heads = out_channels // channels_per_head if attention else 0
        self.dropout, self.res_balance, self.attn_balance = dropout, res_balance, attn_balance
        self.clip_act = clip_act

    def __call__(self, x: jax.Array, emb: jax.Array, is_training: bool = False) -> jax.Array:
        in_channels, cout = x.shape[-1], self.out_channels
        emb_gain = hk.get_parameter("emb_gain", [], jnp.float32, hk.initializers.Constant(0.0))
        # Main branch.
        x = resample(x, self.resample_filter, self.resample_mode)
        if self.flavor == "enc":
            if in_channels != cout:
                x = MPConv(cout, (1, 1), name="conv_skip")(x)
            x = normalize(x, axes=(-1,))  # pixel norm

        # Residual branch.
        y = MPConv(cout, (3, 3), name="conv_res0")(mp_silu(x))
        c = MPConv(cout, (), name="emb_linear")(emb, gain=emb_gain) + 1
        y = mp_silu(y * c[:, None, None, :].astype(y.dtype))
        if is_training and self.dropout != 0:
            y = apply_dropout(hk.next_rng_key(), self.dropout, y)
        y = MPConv(cout, (3, 3), name="conv_res1")(y)

        # Connect the branches.
        if self.flavor == "dec" and in_channels != cout:
            x = MPConv(cout, (1, 1), name="conv_skip")(x)
        x = mp_sum(x, y, t=self.res_balance)

        # Self-attention: qkv channels are (head, channel, q|k|v), as the reference reshapes them.
        if self.num_heads != 0:
            b, h, w, _ = x.shape
            y = MPConv(cout * 3, (1, 1), name="attn_qkv")(x)
            y = y.reshape(b, h * w, self.num_heads, -1, 3)
            y = normalize(y, axes=(3,))  # pixel norm
            q, k, v = y[..., 0], y[..., 1], y[..., 2]
            logits = jnp.einsum("nqhc,nkhc->nhqk", q, k / np.sqrt(q.shape[-1]))
            weights = jax.nn.softmax(logits, axis=-1)
            y = jnp.einsum("nhqk,nkhc->nqhc", weights, v).reshape(b, h, w, cout)
            y = MPConv(cout, (1, 1), name="attn_proj")(y)
            x = mp_sum(x, y, t=self.attn_balance)

        # Clip activations.
        if self.clip_act is not None:
            x = jnp.clip(x, -self.clip_act, self.clip_act)
        return x


class EDM2UNet(hk.Module):
    """F(x, c_noise; label) -> [B, H, W, C], the reference ``UNet``'s forward.

    Constructor arguments are the reference's (``img_resolution`` and ``img_channels`` read from
    the input; ``label_dim`` None takes the label's width, 0 builds no ``emb_label``), with its
    ``**block_kwargs`` spelled out: ``resample_filter``, ``channels_per_head``, ``dropout``,
    ``res_balance``, ``attn_balance``, ``clip_act``. ``label`` is [B, label_dim] (the
    ``class_label`` encoder's one-hot; a missing one is the zero vector).
    """

    def __init__(
        self,
        model_channels: int = 192,
        channel_mult: Sequence[int] = (1, 2, 3, 4),
        channel_mult_noise: int | None = None,
        channel_mult_emb: int | None = None,
        num_blocks: int = 3,
        attn_resolutions: Sequence[int] = (16, 8),
        label_balance: float = 0.5,
        concat_balance: float = 0.5,
        label_dim: int | None = None,
        resample_filter: Sequence[int] = (1, 1),
        channels_per_head: int = 64,
        dropout: float = 0.0,
        res_balance: float = 0.3,
        attn_balance: float = 0.3,
        clip_act: float | None = 256.0,
        name: str | None = "edm2unet",
    ):
        super().__init__(name=name)
        if not channel_mult or num_blocks < 1 or model_channels < 1:
            raise ValueError(
                f"EDM2UNet: need channel_mult non-empty, num_blocks >= 1, model_channels >= 1; got "
                f"{channel_mult}, {num_blocks}, {model_channels}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"EDM2UNet: dropout must be in [0, 1), got {dropout}")
        self.cblock = [model_channels * m for m in channel_mult]
        self.cnoise = (
            model_channels * channel_mult_noise if channel_mult_noise is not None else self.cblock[0]
        )
        self.cemb = model_channels * channel_mult_emb if channel_mult_emb is not None else max(self.cblock)
        self.num_blocks, self.attn_resolutions = num_blocks, tuple(attn_resolutions)
        self.label_balance, self.concat_balance, self.label_dim = label_balance, concat_balance, label_dim
        self.block_kwargs = dict(
            resample_filter=tuple(resample_filter),
            channels_per_head=channels_per_head,
            dropout=dropout,
            res_balance=res_balance,
            attn_balance=attn_balance,
            clip_act=clip_act,
        )

    def __call__(
        self,
        x: jax.Array,
        noise_level: jax.Array,
        *,
        label: jax.Array | None = None,
        is_training: bool = False,
    ) -> jax.Array:
        batch, img_resolution, _, img_channels = x.shape
        kw, cemb = self.block_kwargs, self.cemb
        out_gain = hk.get_parameter("out_gain", [], jnp.float32, hk.initializers.Constant(0.0))

        # Embedding.
        emb = MPFourier(self.cnoise, name="emb_fourier")(noise_level)
        emb = MPConv(cemb, (), name="emb_noise")(emb)
        label, _ = embed_conditions("EDM2UNet", self.label_dim, 0, label, None, batch)
        if label is not None:
            scaled = label * np.sqrt(label.shape[1])
            emb = mp_sum(emb, MPConv(cemb, (), name="emb_label")(scaled), t=self.label_balance)
        emb = mp_silu(emb)

        # Encoder.
        x = jnp.concatenate([x, jnp.ones_like(x[..., :1])], axis=-1)
        skips = []
        for level, channels in enumerate(self.cblock):
            res = img_resolution >> level
            if level == 0:
                x = MPConv(channels, (3, 3), name=f"enc_{res}x{res}_conv")(x)
            else:
                down = Block(x.shape[-1], "enc", "down", name=f"enc_{res}x{res}_down", **kw)
                x = down(x, emb, is_training)
            skips.append(x)
            for idx in range(self.num_blocks):
                attn = res in self.attn_resolutions
                block = Block(channels, "enc", attention=attn, name=f"enc_{res}x{res}_block{idx}", **kw)
                x = block(x, emb, is_training)
                skips.append(x)

        # Decoder.
        for level, channels in reversed(list(enumerate(self.cblock))):
            res = img_resolution >> level
            if level == len(self.cblock) - 1:
                x = Block(x.shape[-1], "dec", attention=True, name=f"dec_{res}x{res}_in0", **kw)(
                    x, emb, is_training
                )
                x = Block(x.shape[-1], "dec", name=f"dec_{res}x{res}_in1", **kw)(x, emb, is_training)
            else:
                x = Block(x.shape[-1], "dec", "up", name=f"dec_{res}x{res}_up", **kw)(x, emb, is_training)
            for idx in range(self.num_blocks + 1):
                x = mp_cat(x, skips.pop(), t=self.concat_balance)
                attn = res in self.attn_resolutions
                block = Block(channels, "dec", attention=attn, name=f"dec_{res}x{res}_block{idx}", **kw)
                x = block(x, emb, is_training)
        return MPConv(img_channels, (3, 3), name="out_conv")(x, gain=out_gain)


registry.models.register("edm2unet", EDM2UNet)
