"""EDM2's preconditioned denoiser with its uncertainty head, NVlabs/edm2 ``Precond``
(``training/networks_edm2.py``), in haiku and channels-last. Registered as
``dew.models["edm2"]``; the ``edm2`` objective (``dew.objectives.edm2``) trains it.

D(x; σ) = c_skip x + c_out F(c_in x; c_noise), with (Karras et al. 2022, Table 1; EDM2 keeps them)
c_skip = σ_d² / (σ² + σ_d²), c_out = σ σ_d / √(σ² + σ_d²), c_in = 1 / √(σ_d² + σ²),
c_noise = ln(σ) / 4; and the learned log-variance u(σ) = logvar_linear(MPFourier(c_noise))
(EDM2 Eq. 21).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import chex
import haiku as hk
import jax
import jax.numpy as jnp

from dew import registry
from dew.networks.edm2_layers import MPConv, MPFourier
from dew.networks.edm2_unet import EDM2UNet

# The UNet's arguments (the reference's ``**unet_kwargs``): the Precond spells them out, so that
# config.model's keys are read from its signature, and passes each on as given (sequences as tuples).
_UNET_ARGUMENTS = tuple(key for key in inspect.signature(EDM2UNet).parameters if key != "name")
_SEQUENCES = ("channel_mult", "attn_resolutions", "resample_filter")


class EDM2Precond(hk.Module):
    """(D(x; σ), u(σ)) or D(x; σ): the reference ``Precond.forward``.

    Constructor arguments are the reference's: ``img_resolution``/``img_channels`` are read from
    the input; ``label_dim`` None takes the label's width; ``use_fp16`` is accepted for the
    reference's signature, and as the reference does off CUDA, the network runs in float32;
    ``sigma_data``, ``logvar_channels``, and the ``UNet`` arguments (``**unet_kwargs`` spelled
    out, see ``EDM2UNet``).
    """

    def __init__(
        self,
        label_dim: int | None = None,
        use_fp16: bool = True,
        sigma_data: float = 0.5,
        logvar_channels: int = 128,
        model_channels: int = 192,
        channel_mult: Sequence[int] = (1, 2, 3, 4),
        channel_mult_noise: int | None = None,
        channel_mult_emb: int | None = None,
        num_blocks: int = 3,
        attn_resolutions: Sequence[int] = (16, 8),
        label_balance: float = 0.5,
        concat_balance: float = 0.5,
        resample_filter: Sequence[int] = (1, 1),
        channels_per_head: int = 64,
        dropout: float = 0.0,
        res_balance: float = 0.3,
        attn_balance: float = 0.3,
        clip_act: float | None = 256.0,
        name: str | None = "edm2",
    ):
        given = dict(locals())  # the arguments, before anything else is bound
        super().__init__(name=name)
        if not sigma_data > 0:
            raise ValueError(f"EDM2Precond: sigma_data must be > 0, got {sigma_data}")
        self.label_dim, self.use_fp16 = label_dim, use_fp16
        self.sigma_data, self.logvar_channels = float(sigma_data), logvar_channels
        self.unet_kwargs = {
            key: tuple(given[key]) if key in _SEQUENCES else given[key] for key in _UNET_ARGUMENTS
        }

    def __call__(
        self,
        x: jax.Array,
        sigma: jax.Array,
        *,
        label: jax.Array | None = None,
        is_training: bool = False,
        return_logvar: bool = False,
        activations: Any = jnp.float32,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """x [B, H, W, C], σ [B] (or a scalar) -> D [B, H, W, C] (and u(σ) [B, 1, 1, 1]).

        ``activations``: the U-Net's dtype (its input cast once, as the reference's
        ``x.to(dtype)`` under ``use_fp16``; every MPConv casts its float32-normalised weight to
        it); c_in, c_skip, c_out, c_noise, the embeddings and the log-variance stay float32."""
        x = x.astype(jnp.float32)
        sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32).reshape(-1), x.shape[:1])
        chex.assert_rank(x, 4)
        s = sigma.reshape(-1, 1, 1, 1)
        sd = self.sigma_data
        c_skip = sd**2 / (s**2 + sd**2)
        c_out = s * sd / jnp.sqrt(s**2 + sd**2)
        c_in = 1 / jnp.sqrt(sd**2 + s**2)
        c_noise = jnp.log(sigma) / 4
        unet = EDM2UNet(**self.unet_kwargs, name="unet")
        f_x = unet((c_in * x).astype(activations), c_noise, label=label, is_training=is_training)
        d_x = c_skip * x + c_out * f_x.astype(jnp.float32)
        if not return_logvar:
            return d_x
        logvar = MPConv(1, (), name="logvar_linear")(
            MPFourier(self.logvar_channels, name="logvar_fourier")(c_noise)
        )
        return d_x, logvar.reshape(-1, 1, 1, 1)


registry.models.register("edm2", EDM2Precond)
