"""``SongUNet``: the DDPM++ and NCSN++ U-Nets of Song et al. 2021 exactly as NVlabs/edm builds them
(``training/networks.py``), in haiku and channels-last. Registered as ``dew.models["songunet"]``.

Same constructor arguments, defaults, layer structure, parameter names and counts, and
initialisation as the reference; ``img_resolution`` and ``in_channels`` are read from the input,
``out_channels`` defaults to ``in_channels`` (as ``EDMPrecond`` builds it). The EDM
preconditioning wrapper (``EDMPrecond``: c_skip, c_out, c_in, c_noise) is ``dew.diffusion.Process``
(the ``EDM`` preset computes the same four functions); EDM's ``label_dropout`` is the diffusion
objective's ``condition_dropout`` (a dropped class label is the all-zero one-hot, as in the
reference). Preset argument sets: ``DDPMPP`` and ``NCSNPP`` below (EDM's ``train.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from haiku import experimental as hk_experimental

from dew import registry
from dew.networks.edm_block import UNetBlock
from dew.networks.edm_inputs import check_choice, embed_conditions
from dew.networks.edm_layers import Conv2d, FourierEmbedding, GroupNorm, Linear, positional_embedding
from dew.networks.remat import REMAT_POLICIES

DDPMPP = {
    "embedding_type": "positional",
    "encoder_type": "standard",
    "decoder_type": "standard",
    "channel_mult_noise": 1,
    "resample_filter": (1, 1),
    "model_channels": 128,
    "channel_mult": (2, 2, 2),
}
"""EDM ``train.py --arch=ddpmpp`` (its CIFAR-10 setting)."""

NCSNPP = {
    "embedding_type": "fourier",
    "encoder_type": "residual",
    "decoder_type": "standard",
    "channel_mult_noise": 2,
    "resample_filter": (1, 3, 3, 1),
    "model_channels": 128,
    "channel_mult": (2, 2, 2),
}
"""EDM ``train.py --arch=ncsnpp``."""


def run_block(
    block: UNetBlock,
    x: jax.Array,
    emb: jax.Array,
    is_training: bool,
    remat: str,
    key: jax.Array | None = None,
) -> jax.Array:
    """``block(x, emb)``; with ``remat``, under ``hk.remat`` (jax.checkpoint) with its named
    policy: the block's activations are recomputed in the backward pass instead of kept.
    ``key``: the block's dropout key (None: the block draws it)."""
    if remat == "none":
        return block(x, emb, is_training, key)
    policy = REMAT_POLICIES[remat]
    return hk.remat(lambda x_, emb_, k_: block(x_, emb_, is_training, k_), policy=policy)(x, emb, key)


class SongUNet(hk.Module):
    """F_θ(x, c_noise; label, augment_labels) -> [B, H, W, out_channels], the reference's forward.

    ``label`` is a [B, label_dim] class vector (the ``class_label`` encoder's one-hot; all zeros =
    unconditional); it is scaled by √label_dim before ``map_label`` as in the reference.
    ``label_dim`` None takes the width of the label passed; 0 builds no label map. Without a
    label, a conditional network sees the zero vector (``EDMPrecond``'s behaviour).
    ``augment_labels`` [B, augment_dim] feed ``map_augment`` when ``augment_dim`` > 0 and they
    are given (sampling passes none, as EDM's generator does). ``remat`` (``REMAT_POLICIES``)
    rematerialises each block in the backward pass; it changes memory and time, not the function.
    ``scan_blocks`` runs each run of consecutive blocks with identical shapes (e.g. a level's
    blocks after its first) as one ``jax.lax.scan`` over their stacked parameters: a smaller
    program to compile, the same parameter tree (names and shapes) and the same function.
    """

    def __init__(
        self,
        model_channels: int = 128,
        channel_mult: Sequence[int] = (1, 2, 2, 2),
        channel_mult_emb: int = 4,
        num_blocks: int = 4,
        attn_resolutions: Sequence[int] = (16,),
        dropout: float = 0.10,
        label_dim: int | None = None,
        augment_dim: int = 0,
        embedding_type: str = "positional",
        channel_mult_noise: int = 1,
        encoder_type: str = "standard",
        decoder_type: str = "standard",
        resample_filter: Sequence[int] = (1, 1),
        out_channels: int | None = None,
        remat: str = "none",
        scan_blocks: bool = False,
        name: str | None = "songunet",
    ):
        super().__init__(name=name)
        check_choice("SongUNet", "remat", remat, tuple(REMAT_POLICIES))
        if not isinstance(scan_blocks, bool):
            raise ValueError(f"SongUNet: scan_blocks={scan_blocks!r} is unknown: expected True or False")
        check_choice("SongUNet", "embedding_type", embedding_type, ("fourier", "positional"))
        check_choice("SongUNet", "encoder_type", encoder_type, ("standard", "skip", "residual"))
        check_choice("SongUNet", "decoder_type", decoder_type, ("standard", "skip"))
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"SongUNet: dropout must be in [0, 1), got {dropout}")
        if not channel_mult or num_blocks < 1 or model_channels < 1:
            raise ValueError(
                f"SongUNet: need channel_mult non-empty, num_blocks >= 1, model_channels >= 1; got "
                f"{channel_mult}, {num_blocks}, {model_channels}"
            )
        self.model_channels, self.channel_mult = model_channels, tuple(channel_mult)
        self.emb_channels = model_channels * channel_mult_emb
        self.noise_channels = model_channels * channel_mult_noise
        self.num_blocks, self.attn_resolutions = num_blocks, tuple(attn_resolutions)
        self.dropout, self.label_dim, self.augment_dim = dropout, label_dim, augment_dim
        self.embedding_type, self.encoder_type, self.decoder_type = embedding_type, encoder_type, decoder_type
        self.resample_filter, self.out_channels = tuple(resample_filter), out_channels
        self.remat, self.scan_blocks = remat, scan_blocks
        self.init = {"init_mode": "xavier_uniform"}
        self.init_zero = {"init_mode": "xavier_uniform", "init_weight": 1e-5}
        self.init_attn = {"init_mode": "xavier_uniform", "init_weight": float(np.sqrt(0.2))}

    def _block_kwargs(self) -> dict:
        """The reference's ``block_kwargs``. (Blocks are built in ``__call__`` so haiku names them
        ``<net>/<block>``, not under a helper method's scope.)"""
        return dict(
            num_heads=1,
            dropout=self.dropout,
            skip_scale=float(np.sqrt(0.5)),
            eps=1e-6,
            resample_filter=self.resample_filter,
            resample_proj=True,
            adaptive_scale=False,
            init=self.init,
            init_zero=self.init_zero,
            init_attn=self.init_attn,
        )

    def _run(
        self, block: UNetBlock, x: jax.Array, emb: jax.Array, is_training: bool, key: jax.Array | None = None
    ) -> jax.Array:
        return run_block(block, x, emb, is_training, self.remat, key)

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
        # Mapping.
        if self.embedding_type == "positional":
            emb = positional_embedding(noise_level, self.noise_channels, endpoint=True)
        else:
            emb = FourierEmbedding(self.noise_channels, name="map_noise")(noise_level)
        half = self.noise_channels // 2
        emb = jnp.concatenate([emb[:, half:], emb[:, :half]], axis=1)  # the reference's sin/cos swap
        label, augment_labels = embed_conditions(
            "SongUNet", self.label_dim, self.augment_dim, label, augment_labels, batch
        )
        if label is not None:
            scaled = label * np.sqrt(label.shape[-1])
            emb = emb + Linear(self.noise_channels, init=self.init, name="map_label")(scaled)
        if augment_labels is not None:
            emb = emb + Linear(self.noise_channels, bias=False, init=self.init, name="map_augment")(
                augment_labels
            )
        emb = jax.nn.silu(Linear(self.emb_channels, init=self.init, name="map_layer0")(emb))
        emb = jax.nn.silu(Linear(self.emb_channels, init=self.init, name="map_layer1")(emb))
        kw = self._block_kwargs()
        mc, last = self.model_channels, len(self.channel_mult) - 1

        # Encoder.
        skips, aux = [], x
        for level, mult in enumerate(self.channel_mult):
            res = img_resolution >> level
            if level == 0:
                x = Conv2d(mc, 3, init=self.init, name=f"enc_{res}x{res}_conv")(x)
            else:
                x = self._run(
                    UNetBlock(x.shape[-1], name=f"enc_{res}x{res}_down", **kw, down=True), x, emb, is_training
                )
                if self.encoder_type == "skip":
                    aux = Conv2d(
                        aux.shape[-1],
                        0,
                        down=True,
                        resample_filter=self.resample_filter,
                        name=f"enc_{res}x{res}_aux_down",
                    )(aux)
                    x = x + Conv2d(x.shape[-1], 1, init=self.init, name=f"enc_{res}x{res}_aux_skip")(aux)
                elif self.encoder_type == "residual":
                    residual = Conv2d(
                        x.shape[-1],
                        3,
                        down=True,
                        resample_filter=self.resample_filter,
                        fused_resample=True,
                        init=self.init,
                        name=f"enc_{res}x{res}_aux_residual",
                    )(aux)
                    x = aux = (x + residual) / np.sqrt(2)
            skips.append(x)
            attn = res in self.attn_resolutions
            specs = [
                (f"enc_{res}x{res}_block{idx}", {"out_channels": mc * mult, "attention": attn})
                for idx in range(self.num_blocks)
            ]
            x, outputs = run_blocks(self, specs, x, emb, is_training)
            skips.extend(outputs)

        # Decoder.
        aux = None
        for level, mult in reversed(list(enumerate(self.channel_mult))):
            res = img_resolution >> level
            if level == last:
                block = UNetBlock(x.shape[-1], name=f"dec_{res}x{res}_in0", **kw, attention=True)
                x = self._run(block, x, emb, is_training)
                x = self._run(UNetBlock(x.shape[-1], name=f"dec_{res}x{res}_in1", **kw), x, emb, is_training)
            else:
                block = UNetBlock(x.shape[-1], name=f"dec_{res}x{res}_up", **kw, up=True)
                x = self._run(block, x, emb, is_training)
            specs = [
                (
                    f"dec_{res}x{res}_block{idx}",
                    {
                        "out_channels": mc * mult,
                        "attention": idx == self.num_blocks and res in self.attn_resolutions,
                    },
                )
                for idx in range(self.num_blocks + 1)
            ]
            x, _ = run_blocks(self, specs, x, emb, is_training, [skips.pop() for _ in specs])
            if self.decoder_type == "skip" or level == 0:
                if self.decoder_type == "skip" and level < last:
                    aux = Conv2d(
                        out_channels,
                        0,
                        up=True,
                        resample_filter=self.resample_filter,
                        name=f"dec_{res}x{res}_aux_up",
                    )(aux)
                tmp = GroupNorm(1e-6, name=f"dec_{res}x{res}_aux_norm")(x)
                tmp = Conv2d(out_channels, 3, init=self.init_zero, name=f"dec_{res}x{res}_aux_conv")(
                    jax.nn.silu(tmp)
                )
                aux = tmp if aux is None else tmp + aux
        assert aux is not None  # level 0 always writes the output
        return aux


def run_blocks(
    net: SongUNet,
    specs: Sequence[tuple[str, dict]],
    x: jax.Array,
    emb: jax.Array,
    is_training: bool,
    concat: Sequence[jax.Array] | None = None,
) -> tuple[jax.Array, list[jax.Array]]:
    """``net``'s ``UNetBlock`` s ``specs`` ((name, out_channels/attention)) one after another from
    ``x``; block k sees ``[x, concat[k]]`` (channels) when ``concat`` is given (the decoder's
    skips). Returns the last output and every block's output, in order. Called from
    ``SongUNet.__call__`` (a function, not a method, so haiku names the blocks ``<net>/<block>``).

    With ``net.scan_blocks`` (outside init), each run of two or more consecutive blocks whose
    inputs and parameters have the same shapes is one ``jax.lax.scan`` (``scan_blocks``); init
    is always unrolled, so the parameters are created exactly as without it."""
    outputs: list[jax.Array] = []
    k = 0
    while k < len(specs):
        run = run_length(specs, x, concat, k) if net.scan_blocks and not hk.running_init() else 1
        if run > 1:
            skips = None if concat is None else concat[k : k + run]
            x, ys = scan_blocks(net, specs[k : k + run], x, emb, is_training, skips)
            outputs.extend(ys)
        else:
            name, spec = specs[k]
            inp = x if concat is None else jnp.concatenate([x, concat[k]], axis=-1)
            block = UNetBlock(name=name, **net._block_kwargs(), **spec)
            x = run_block(block, inp, emb, is_training, net.remat)
            outputs.append(x)
        k += run
    return x, outputs


def run_length(
    specs: Sequence[tuple[str, dict]], x: jax.Array, concat: Sequence[jax.Array] | None, k: int
) -> int:
    """How many blocks from ``specs[k]`` on have block k's signature: the same input shapes
    (the carried activation's and the skip's) and the same arguments, hence the same parameter
    shapes; block j > k carries block j-1's output (``out_channels`` wide)."""

    def signature(j: int, carried: int) -> tuple:
        skip = None if concat is None else tuple(concat[j].shape)
        return carried, skip, tuple(sorted(specs[j][1].items()))

    first = signature(k, x.shape[-1])
    run = 1
    while k + run < len(specs) and signature(k + run, specs[k + run - 1][1]["out_channels"]) == first:
        run += 1
    return run


def scan_blocks(
    net: SongUNet,
    specs: Sequence[tuple[str, dict]],
    x: jax.Array,
    emb: jax.Array,
    is_training: bool,
    concat: Sequence[jax.Array] | None,
) -> tuple[jax.Array, list[jax.Array]]:
    """Blocks of one signature as a ``jax.lax.scan`` over their parameters, stacked in the forward
    pass (``jnp.stack`` of each block's stored parameters: the tree keeps the reference's
    per-block names and shapes). The body applies one block as a pure function (an inner
    ``hk.transform``, remat'ed as ``run_block`` does); the dropout keys are drawn before the
    scan, one per block in block order: exactly the keys the unrolled blocks draw."""
    params = hk.get_params()
    prefixes = [f"{hk_experimental.current_name()}/{name}" for name, _ in specs]
    first = prefixes[0]
    suffixes = [m[len(first) :] for m in params if m == first or m.startswith(first + "/")]
    if not suffixes:
        raise ValueError(f"SongUNet: scan_blocks found no parameters under {first!r}")
    stacked = {
        f"block{suffix}": {
            p: jnp.stack([params[prefix + suffix][p] for prefix in prefixes]) for p in params[first + suffix]
        }
        for suffix in suffixes
    }
    keys = jnp.stack([hk.next_rng_key() for _ in specs]) if is_training and net.dropout > 0 else None
    kw, remat = {**net._block_kwargs(), **specs[0][1]}, net.remat
    block = hk.transform(
        lambda x_, emb_, k_: run_block(UNetBlock(name="block", **kw), x_, emb_, is_training, remat, k_)
    )

    def body(carry: jax.Array, xs: tuple) -> tuple[jax.Array, jax.Array]:
        p, key, skip = xs
        inp = carry if skip is None else jnp.concatenate([carry, skip], axis=-1)
        out = block.apply(p, None, inp, emb, key)
        return out, out

    skips = None if concat is None else jnp.stack(concat)
    x, ys = jax.lax.scan(body, x, (stacked, keys, skips))
    return x, list(ys)


registry.models.register("songunet", SongUNet)
