"""DiT and SiT: the class-conditional latent transformers of Peebles & Xie 2023 and Ma et al. 2024,
exactly as facebookresearch/DiT ``models.py`` and willisma/SiT ``models.py`` build them, in haiku and
channels-last. Registered in ``dew.models`` under the references' names — ``DiT-S/2`` … ``DiT-XL/8``
and ``SiT-S/2`` … ``SiT-XL/8`` (S, B, L, XL × patch 2, 4, 8) — and as ``dit`` / ``sit`` whose
size comes from the config fields ``depth``, ``hidden_size``, ``num_heads``, ``patch_size``.

The call (inside ``hk.transform``; ``net = dew.models["SiT-XL/2"](**options)``)::

    out = net(x, t, y, *, h=None, is_training=False, force_drop_ids=None, return_features=False)

- ``x`` [B, H, W, C] (channels-last latents; H = W, a multiple of ``patch_size``);
- ``t`` [B] (or a scalar): DiT's integer diffusion step 0…999 or SiT's continuous t in [0, 1],
  embedded the same way (sinusoidal, 256 frequencies, then an MLP);
- ``y`` [B] int class labels; ``num_classes`` is the null class classifier-free guidance uses
  (the label table has that row when ``null_class``, by default when ``class_dropout_prob`` > 0
  as in DiT; MeanFlow builds ``class_dropout_prob=0.0`` and keeps it: ``null_class=True``);
- ``h`` [B]: the second time input of MeanFlow (Gsunshine/meanflow ``models_dit.py``: h = t − r
  through its own ``h_embedder``, c = t_emb + h_emb + y_emb); only with ``time_inputs=("t", "h")``;
- ``is_training``: label dropout (``class_dropout_prob``) draws ``hk.next_rng_key()``;
  ``force_drop_ids`` [B] (1 = null class) replaces the draw, as the reference's;
- returns [B, H, W, C_out], C_out = 2C with ``learn_sigma`` (DiT: ε then the variance
  interpolation v) else C; SiT builds ``learn_sigma=True`` but returns the first C channels only
  (``sigma_output=False``: the published SiT checkpoints hold the 2C-channel final layer);
- ``return_features=True`` returns ``(out, features)`` for REPA (sihyun-yu/REPA ``models/sit.py``):
  ``features`` is the tuple of projector outputs [B, T, z_dim] (one per ``projector_dims`` entry,
  each REPA's ``build_mlp`` with ``projector_hidden`` units) on the tokens after block
  ``encoder_depth``; with no projectors, the tuple holds those tokens [B, T, hidden_size].

``net.forward_with_cfg(x, t, y, cfg_scale, h=None, cfg_channels=3)`` is the reference's guided
forward: the first half of the batch is run twice (labels ``y`` hold the conditional then the null
labels) and guidance uncond + s·(cond − uncond) acts on the first ``cfg_channels`` channels only
("for exact reproducibility", as DiT and SiT do); the other channels pass through.

Parameters carry the reference's names and counts (``dew.networks.dit_layers``); the fixed
sin-cos ``pos_embed`` (``requires_grad=False`` in the reference) is a constant, not a parameter,
so dew counts the reference's trainable parameters: e.g. DiT-XL/2 at 32×32 latents has
675,129,632 in the reference's ``parameters()``, 256·1152 of which are ``pos_embed``.
``dew.interop.dit_checkpoint`` converts a reference state dict. The LightningDiT options ``norm``,
``mlp``, ``qk_norm`` and ``rotary`` (``dit_layers``) are off by default (= the reference).
Each is checked against the reference's own code on random weights (tests/test_dit.py, goldens
in third_party/dit): DiT, SiT, REPA's projectors, LightningDiT's options, MeanFlow's (t, h) DiT.
``time_direction="repa"`` (default ``"sit"``) runs weights trained by sihyun-yu/REPA, whose time
is the mirror of SiT's (t = 1 at the noise, velocity dx/dt = ε − x), in dew's SiT time s: the
time embedder is fed 1 − s and the output negated, net(x, s) = −REPA(x, 1 − s) (the projector
tokens are REPA's at its t); only for continuous t, ``time_inputs=("t",)``, adaLN, and an output
without variance channels (``dew.convert_dit --source=repa`` sets it).
``remat`` (``dew.networks.remat.REMAT_POLICIES``: ``none``, ``blocks``, ``blocks_save_dots``,
``blocks_save_mlp``, ``blocks_save_products``) recomputes each block's activations in the backward
pass, all of them or all but the named products: less memory, the same function.
``scan_blocks=True`` runs the blocks as one ``lax.scan`` over their stacked parameters
(``dew.networks.block_stack``): the same parameters under the same names and the same function,
compiled once instead of once per block. Off by default: on a TPU v5e the scan keeps every
block's residuals (SiT-B/2 bf16 at batch 64 without remat needed 17.9 GB of temporaries against
8.3 GB unrolled); with ``remat='blocks'`` it fits and shortened SiT-XL/2's first step from 171 s
to 133 s at the same step time (340 against 333 ms).

**In-context conditioning** (``conditioning="in_context"``): improved MeanFlow's network
(Lyy-iiis/imeanflow ``models/imfDiT.py``: ``imfDiT``), registered as ``iMF-B/2``, ``iMF-M/2``,
``iMF-L/2``, ``iMF-XL/2`` and ``imf_dit`` (sizes from the config). Called as

    u, v = net(x, t, y, *, h, omega, t_min, t_max)

it reads no t (``time_inputs=("h",)``; the reference conditions on h = t − r alone) and turns each
condition into learned tokens plus its embedding, prepended to the patch tokens in the reference's
order: ``class_tokens`` (``class_tokens`` of them) + y_embedder(y), ``omega_tokens`` +
omega_embedder(1 − 1/ω), ``t_min_tokens`` + cfg_t_start_embedder(t_min), ``t_max_tokens`` +
cfg_t_end_embedder(t_max), ``time_tokens`` + h_embedder(h) (``cfg_tokens``, ``interval_tokens``,
``time_tokens`` of them). No position embedding is added; instead 1-D rotary positions run over the
whole sequence. The blocks are ``dit_blocks.InContextBlock`` (RMSNorm, QK-RMSNorm, bias-free
q/k/v/out projections and SwiGLU, zero-initialised vector gates; no adaLN), so ``norm``, ``mlp``,
``qk_norm`` and ``rotary`` keep their defaults there. ``depth − head_depth`` shared blocks
(``shared_blocks_i``) run first; with ``v_head=True`` two branches of ``head_depth`` blocks each
(``u_heads_i``, ``v_heads_i``) and their final layers (``u_final_layer``, ``v_final_layer``:
RMSNorm then a zero-initialised linear) return (u, v), the average velocity and iMF's auxiliary
instantaneous velocity; without it the ``head_depth`` blocks are ``u_heads_i`` and u alone is
returned. Initialisation is the reference's: ``token_init_constant``/√D for the tokens,
``embedding_init_constant``/√fan_in for the embedders, ``weight_init_constant``/√fan_in (0.32)
for the blocks' linears. ``dew.interop.flax_dit`` converts the reference's flax parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.networks import dit_blocks as B
from dew.networks import dit_layers as L
from dew.networks.block_stack import run_blocks
from dew.networks.dit_options import (
    IMF_SIZES,
    PATCH_SIZES,
    SIZES,
    check_options,
)
from dew.schema import ConfigError


class DiT(hk.Module):
    """The DiT / SiT transformer; the module docstring states the call."""

    def __init__(
        self,
        depth: int = 28,
        hidden_size: int = 1152,
        num_heads: int = 16,
        patch_size: int = 2,
        mlp_ratio: float = 4.0,
        class_dropout_prob: float = 0.1,
        num_classes: int = 1000,
        null_class: bool | None = None,
        learn_sigma: bool = True,
        sigma_output: bool = True,
        input_size: int | None = None,
        time_inputs: Sequence[str] = ("t",),
        encoder_depth: int | None = None,
        projector_dims: Sequence[int] = (),
        projector_hidden: int = 2048,
        norm: str = "layernorm",
        mlp: str = "gelu_tanh",
        qk_norm: bool = False,
        rotary: bool = False,
        remat: str = "none",
        conditioning: str = "adaln",
        head_depth: int = 0,
        v_head: bool = False,
        class_tokens: int = 8,
        time_tokens: int = 4,
        cfg_tokens: int = 4,
        interval_tokens: int = 2,
        token_init_constant: float = 1.0,
        embedding_init_constant: float = 1.0,
        weight_init_constant: float = 0.32,
        time_direction: str = "sit",
        scan_blocks: bool = False,
        name: str | None = "dit",
    ):
        check_options(
            depth=depth,
            hidden_size=hidden_size,
            num_heads=num_heads,
            patch_size=patch_size,
            class_dropout_prob=class_dropout_prob,
            input_size=input_size,
            time_inputs=time_inputs,
            encoder_depth=encoder_depth,
            projector_dims=projector_dims,
            norm=norm,
            mlp=mlp,
            rotary=rotary,
            remat=remat,
            conditioning=conditioning,
            head_depth=head_depth,
            v_head=v_head,
            qk_norm=qk_norm,
            time_direction=time_direction,
            returns_variance=learn_sigma and sigma_output,
        )
        super().__init__(name=name)
        self.depth, self.hidden_size, self.num_heads, self.patch_size = (
            depth,
            hidden_size,
            num_heads,
            patch_size,
        )
        self.mlp_ratio, self.class_dropout_prob, self.num_classes = mlp_ratio, class_dropout_prob, num_classes
        self.null_class = null_class
        self.learn_sigma, self.sigma_output, self.input_size = learn_sigma, sigma_output, input_size
        self.time_inputs, self.encoder_depth = tuple(time_inputs), encoder_depth
        self.projector_dims, self.projector_hidden = tuple(projector_dims), projector_hidden
        self.norm, self.mlp, self.qk_norm, self.rotary, self.remat = norm, mlp, qk_norm, rotary, remat
        self.conditioning, self.head_depth, self.v_head = conditioning, head_depth, v_head
        self.tokens = {"class": class_tokens, "omega": cfg_tokens, "t_min": interval_tokens}
        self.tokens.update({"t_max": interval_tokens, "time": time_tokens})
        self.init_constants = (token_init_constant, embedding_init_constant, weight_init_constant)
        self.time_direction = time_direction
        self.scan_blocks = bool(scan_blocks)

    def _grid(self, x: jax.Array) -> int:
        _, height, width, _ = x.shape
        if self.input_size is not None and (height, width) != (self.input_size, self.input_size):
            raise ConfigError(
                f"DiT: input {height}x{width} does not match input_size={self.input_size}: "
                "expected square latents of that size"
            )
        if height != width or height % self.patch_size:
            raise ConfigError(
                f"DiT: patch_size={self.patch_size} does not divide the latent resolution "
                f"{height}x{width}: expected square latents whose side is a multiple of the patch size"
            )
        return height // self.patch_size

    def __call__(
        self,
        x: jax.Array,
        t: jax.Array,
        y: jax.Array,
        *,
        h: jax.Array | None = None,
        omega: jax.Array | None = None,
        t_min: jax.Array | None = None,
        t_max: jax.Array | None = None,
        is_training: bool = False,
        force_drop_ids: jax.Array | None = None,
        return_features: bool = False,
    ) -> Any:  # [B, H, W, C]; (out, features) with return_features; (u, v) in context (see the docstring)
        if self.conditioning == "in_context":
            return self._in_context(x, y, h, omega, t_min, t_max, is_training, force_drop_ids)
        if omega is not None or t_min is not None or t_max is not None:
            raise ValueError("DiT: omega / t_min / t_max are inputs of conditioning='in_context' only")
        grid = self._grid(x)
        batch, _, _, in_channels = x.shape
        if ("h" in self.time_inputs) != (h is not None):
            raise ValueError(
                f"DiT: h={'None' if h is None else 'given'} with time_inputs={self.time_inputs}: "
                "pass h exactly when the network is built with time_inputs=('t', 'h')"
            )
        if return_features and self.encoder_depth is None:
            raise ValueError(
                "DiT: return_features=True needs encoder_depth (the block whose tokens it returns)"
            )
        dtype = x.dtype
        pos_embed = L.get_2d_sincos_pos_embed(self.hidden_size, grid).astype(np.float32)
        tokens = L.PatchEmbed(self.patch_size, self.hidden_size, name="x_embedder")(x)
        tokens = tokens + jnp.asarray(pos_embed, dtype)[None]
        t = jnp.broadcast_to(jnp.asarray(t).reshape(-1), (batch,))
        if self.time_direction == "repa":
            t = 1 - t  # REPA's time t = 1 − s: its network was trained with t = 1 at the noise
        c = L.TimestepEmbedder(self.hidden_size, name="t_embedder")(t, dtype)
        if h is not None:
            h = jnp.broadcast_to(jnp.asarray(h).reshape(-1), (batch,))
            c = c + L.TimestepEmbedder(self.hidden_size, name="h_embedder")(h, dtype)
        embedder = L.LabelEmbedder(
            self.num_classes, self.hidden_size, self.class_dropout_prob, self.null_class, name="y_embedder"
        )
        c = c + embedder(jnp.asarray(y, jnp.int32), is_training, force_drop_ids, dtype)

        rotary = L.rotary_tables(self.hidden_size // self.num_heads, grid) if self.rotary else None

        def block(name: str) -> B.DiTBlock:
            return B.DiTBlock(
                self.num_heads,
                self.mlp_ratio,
                norm=self.norm,
                mlp=self.mlp,
                qk_norm=self.qk_norm,
                rotary=rotary,
                name=name,
            )

        features: tuple[jax.Array, ...] = ()
        split = self.encoder_depth or self.depth
        for first, last in ((0, split), (split, self.depth)):
            names = [f"blocks_{i}" for i in range(first, last)]
            tokens = run_blocks(block, names, tokens, c, remat=self.remat, scan=self.scan_blocks)
            if last == self.encoder_depth and first == 0:
                features = tuple(
                    B.projector(tokens, self.projector_hidden, z, j)
                    for j, z in enumerate(self.projector_dims)
                ) or (tokens,)

        out_channels = 2 * in_channels if self.learn_sigma else in_channels
        p = self.patch_size
        out = B.FinalLayer(p * p * out_channels, norm=self.norm, name="final_layer")(tokens, c)
        out = unpatchify(out, grid, p, out_channels)
        if self.learn_sigma and not self.sigma_output:
            out = out[..., :in_channels]
        if self.time_direction == "repa":
            out = -out  # v_S(x, s) = dx/ds = −dx/dt = −v_REPA(x, 1 − s)
        return (out, features) if return_features else out

    @hk.transparent
    def _in_context(self, x, y, h, omega, t_min, t_max, is_training, force_drop_ids):
        """iMF's ``imfDiT.__call__`` (the module docstring): (u, v), or u without the v-head."""
        if any(v is None for v in (h, omega, t_min, t_max)):
            raise ValueError("DiT: conditioning='in_context' needs h, omega, t_min and t_max")
        grid = self._grid(x)
        batch, _, _, in_channels = x.shape
        dtype = x.dtype
        d = self.hidden_size
        token_init, embedding_init, weight_init = self.init_constants

        def per_row(v):
            return jnp.broadcast_to(jnp.asarray(v, jnp.float32).reshape(-1), (batch,))

        def embed(name, v):
            return L.TimestepEmbedder(d, init_constant=embedding_init, name=name)(per_row(v), dtype)

        labels = L.LabelEmbedder(
            self.num_classes,
            d,
            self.class_dropout_prob,
            self.null_class,
            init_std=embedding_init / np.sqrt(d),
            name="y_embedder",
        )(jnp.asarray(y, jnp.int32), is_training, force_drop_ids, dtype)
        conditions = {
            "class": labels,
            "omega": embed("omega_embedder", 1 - 1 / per_row(omega)),
            "t_min": embed("cfg_t_start_embedder", t_min),
            "t_max": embed("cfg_t_end_embedder", t_max),
            "time": embed("h_embedder", h),
        }
        prefix = []
        for key, embedding in conditions.items():
            tokens = hk.get_parameter(
                f"{key}_tokens", [self.tokens[key], d], dtype, L.normal(token_init / np.sqrt(d))
            )
            prefix.append(tokens[None] + embedding[:, None])
        patches = L.PatchEmbed(self.patch_size, d, name="x_embedder")(x)
        seq = jnp.concatenate([*prefix, patches], axis=1)
        n_prefix = seq.shape[1] - patches.shape[1]
        rotary = L.rotary_1d(d // self.num_heads, seq.shape[1])

        def block(name: str) -> B.InContextBlock:
            return B.InContextBlock(self.num_heads, self.mlp_ratio, rotary, weight_init, name=name)

        def run(tokens, names):
            return run_blocks(block, names, tokens, remat=self.remat, scan=self.scan_blocks)

        shared = self.depth - self.head_depth
        seq = run(seq, [f"shared_blocks_{i}" for i in range(shared)])
        out_channels = 2 * in_channels if self.learn_sigma else in_channels
        p = self.patch_size
        outputs = []
        for head in ("u", "v") if self.v_head else ("u",):
            tokens = run(seq, [f"{head}_heads_{i}" for i in range(self.head_depth)])[:, n_prefix:]
            final = B.FinalLayer(p * p * out_channels, "rmsnorm", modulated=False, name=f"{head}_final_layer")
            outputs.append(unpatchify(final(tokens, None), grid, p, out_channels))
        return tuple(outputs) if self.v_head else outputs[0]

    def forward_with_cfg(
        self,
        x: jax.Array,
        t: jax.Array,
        y: jax.Array,
        cfg_scale: float | jax.Array,
        *,
        h: jax.Array | None = None,
        cfg_channels: int = 3,
    ) -> jax.Array:
        """The reference's ``forward_with_cfg``; ``y`` = [labels; null labels] over a batch of 2B."""
        half = x[: x.shape[0] // 2]
        out: jax.Array = self(jnp.concatenate([half, half], axis=0), t, y, h=h)
        eps, rest = out[..., :cfg_channels], out[..., cfg_channels:]
        cond, uncond = jnp.split(eps, 2, axis=0)
        half_eps = uncond + cfg_scale * (cond - uncond)
        return jnp.concatenate([jnp.concatenate([half_eps, half_eps], axis=0), rest], axis=-1)


def unpatchify(x: jax.Array, grid: int, p: int, channels: int) -> jax.Array:
    """[B, grid², p·p·C] -> [B, grid·p, grid·p, C]: token (i, j)'s (a, b, c) entry is pixel
    (i·p + a, j·p + b), channel c (the reference's ``einsum('nhwpqc->nchpwq')``, channels-last)."""
    b = x.shape[0]
    x = x.reshape(b, grid, grid, p, p, channels).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, grid * p, grid * p, channels)


def _sized(size: str, patch: int, **extra) -> functools.partial:
    depth, hidden, heads = SIZES[size]
    return functools.partial(DiT, depth=depth, hidden_size=hidden, num_heads=heads, patch_size=patch, **extra)


SIT = {"sigma_output": False}
"""What SiT changes: the same network (``learn_sigma=True`` built, as SiT's ``train.py``), its
forward returning the first C channels; t is continuous in [0, 1] (the caller's business)."""

IMF = {
    "conditioning": "in_context",
    "patch_size": 2,
    "mlp_ratio": 8 / 3,
    "head_depth": 8,
    "v_head": True,
    "time_inputs": ("h",),
    "class_dropout_prob": 0.0,
    "null_class": True,
    "learn_sigma": False,
}
"""improved MeanFlow's network as dew's DiT options (``imfDiT``'s defaults: 8 class, 4 ω, 2 + 2
interval and 4 time tokens, no label dropout inside the network but the null-class row, C outputs)."""

registry.models.register("dit", DiT)
registry.models.register("imf_dit", functools.partial(DiT, **IMF))
for _size, (_depth, _hidden, _heads) in IMF_SIZES.items():
    registry.models.register(
        f"iMF-{_size}/2",
        functools.partial(DiT, depth=_depth, hidden_size=_hidden, num_heads=_heads, **IMF),
    )
registry.models.register("sit", functools.partial(DiT, **SIT))
for _size in SIZES:
    for _patch in PATCH_SIZES:
        registry.models.register(f"DiT-{_size}/{_patch}", _sized(_size, _patch))
        registry.models.register(f"SiT-{_size}/{_patch}", _sized(_size, _patch, **SIT))
