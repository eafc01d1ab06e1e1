"""``DhariwalUNet``: the ADM U-Net of Dhariwal & Nichol 2021 exactly as NVlabs/edm builds it
(``training/networks.py``), in haiku and channels-last. Registered as ``dew.models["dhariwalunet"]``.

Same arguments, defaults, structure, parameter names and counts, and initialisation as the
reference (kaiming-uniform ×√⅓, exactly-zero output layers, the embedding as a (scale, shift)
pair after ``norm1``, heads of 64 channels). ``img_resolution``/``in_channels`` come from the
input, ``out_channels`` defaults to ``in_channels``. Preconditioning and label dropout: see
``dew.networks.songunet``.
"""

from __future__ import annotations

from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.networks.edm_block import UNetBlock
from dew.networks.edm_inputs import embed_conditions
from dew.networks.edm_layers import Conv2d, GroupNorm, Linear, positional_embedding


class DhariwalUNet(hk.Module):
    """F_θ(x, c_noise; label, augment_labels) -> [B, H, W, out_channels], the reference's forward.

    ``label`` [B, label_dim] enters ``map_label`` unscaled (its initialisation carries the
    √label_dim), added after ``map_layer1``; conditioning rules as in ``SongUNet``.
    """

    def __init__(
        self,
        model_channels: int = 192,
        channel_mult: Sequence[int] = (1, 2, 3, 4),
        channel_mult_emb: int = 4,
        num_blocks: int = 3,
        attn_resolutions: Sequence[int] = (32, 16, 8),
        dropout: float = 0.10,
        label_dim: int | None = None,
        augment_dim: int = 0,
        out_channels: int | None = None,
        name: str | None = "dhariwalunet",
    ):
        super().__init__(name=name)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"DhariwalUNet: dropout must be in [0, 1), got {dropout}")
        if not channel_mult or num_blocks < 1 or model_channels < 1:
            raise ValueError(
                f"DhariwalUNet: need channel_mult non-empty, num_blocks >= 1, model_channels >= 1; got "
                f"{channel_mult}, {num_blocks}, {model_channels}"
            )
        self.model_channels, self.channel_mult = model_channels, tuple(channel_mult)
        self.emb_channels = model_channels * channel_mult_emb
        self.num_blocks, self.attn_resolutions = num_blocks, tuple(attn_resolutions)
        self.dropout, self.label_dim, self.augment_dim = dropout, label_dim, augment_dim
        self.out_channels = out_channels
        self.init = {
            "init_mode": "kaiming_uniform",
            "init_weight": float(np.sqrt(1 / 3)),
            "init_bias": float(np.sqrt(1 / 3)),
        }
        self.init_zero = {"init_mode": "kaiming_uniform", "init_weight": 0.0, "init_bias": 0.0}

    def _block_kwargs(self) -> dict:
        """The reference's ``block_kwargs``. (Blocks are built in ``__call__`` so haiku names them
        ``<net>/<block>``, not under a helper method's scope.)"""
        return dict(channels_per_head=64, dropout=self.dropout, init=self.init, init_zero=self.init_zero)

    def __call__(
        self,
        x: jax.Array,
        noise_level: jax.Array,
        *,
        label: jax.Array | None = None,
        augment_labels: jax.Array | None = None,
        is_training: bool = False,
    ) -> jax.Array:
        batch, img_resolution, _, in_channels = x.shape
        out_channels = self.out_channels or in_channels
        label, augment_labels = embed_conditions(
            "DhariwalUNet", self.label_dim, self.augment_dim, label, augment_labels, batch
        )
        emb = positional_embedding(noise_level, self.model_channels)
        if augment_labels is not None:
            emb = emb + Linear(self.model_channels, bias=False, init=self.init_zero, name="map_augment")(
                augment_labels
            )
        emb = jax.nn.silu(Linear(self.emb_channels, init=self.init, name="map_layer0")(emb))
        emb = Linear(self.emb_channels, init=self.init, name="map_layer1")(emb)
        if label is not None:
            label_init = {"init_mode": "kaiming_normal", "init_weight": float(np.sqrt(label.shape[-1]))}
            emb = emb + Linear(self.emb_channels, bias=False, init=label_init, name="map_label")(label)
        emb = jax.nn.silu(emb)

        kw = self._block_kwargs()
        skips = []
        for level, mult in enumerate(self.channel_mult):
            res = img_resolution >> level
            if level == 0:
                x = Conv2d(self.model_channels * mult, 3, init=self.init, name=f"enc_{res}x{res}_conv")(x)
            else:
                x = UNetBlock(x.shape[-1], name=f"enc_{res}x{res}_down", **kw, down=True)(x, emb, is_training)
            skips.append(x)
            for idx in range(self.num_blocks):
                attn = res in self.attn_resolutions
                block = UNetBlock(
                    self.model_channels * mult, name=f"enc_{res}x{res}_block{idx}", **kw, attention=attn
                )
                x = block(x, emb, is_training)
                skips.append(x)

        last = len(self.channel_mult) - 1
        for level, mult in reversed(list(enumerate(self.channel_mult))):
            res = img_resolution >> level
            if level == last:
                x = UNetBlock(x.shape[-1], name=f"dec_{res}x{res}_in0", **kw, attention=True)(
                    x, emb, is_training
                )
                x = UNetBlock(x.shape[-1], name=f"dec_{res}x{res}_in1", **kw)(x, emb, is_training)
            else:
                x = UNetBlock(x.shape[-1], name=f"dec_{res}x{res}_up", **kw, up=True)(x, emb, is_training)
            for idx in range(self.num_blocks + 1):
                x = jnp.concatenate([x, skips.pop()], axis=-1)
                attn = res in self.attn_resolutions
                x = UNetBlock(
                    self.model_channels * mult, name=f"dec_{res}x{res}_block{idx}", **kw, attention=attn
                )(x, emb, is_training)
        x = GroupNorm(1e-5, name="out_norm")(x)
        return Conv2d(out_channels, 3, init=self.init_zero, name="out_conv")(jax.nn.silu(x))


registry.models.register("dhariwalunet", DhariwalUNet)
