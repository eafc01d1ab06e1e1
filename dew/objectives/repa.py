"""REPA: representation alignment (Yu et al. 2025, sihyun-yu/REPA ``loss.py`` ``SILoss``,
``train.py``), the ``repa`` options of the ``interpolant`` objective.

The network's tokens after block ``encoder_depth`` go through a projector MLP (REPA's
``build_mlp``, in ``dew.networks.dit``: ``projector_dims=(embed_dim,)``, ``projector_hidden =
projector_dim``), giving z̃ [B, T, D]; a frozen encoder's patch tokens z [B, T, D] of the same
batch's images are the targets. The alignment loss is ``SILoss``'s ``proj_loss``:

    proj_loss = 1/(K·B) Σ_k Σ_b mean_t −⟨z_kbt/‖z_kbt‖, z̃_kbt/‖z̃_kbt‖⟩

(``F.normalize``: x / max(‖x‖, 1e−12); K encoders), and the step minimises
``denoising.mean() + proj_coeff · proj_loss`` (``train.py``: ``loss_mean + proj_loss_mean *
args.proj_coeff``). The encoder's tokens are computed inside the jitted step on the same batch,
under ``stop_gradient`` (REPA: ``torch.no_grad()``).

**Where the frozen encoder's weights live.** They are loaded once, on the host, by
``interpolant``'s ``from_config`` and handed to the objective's constructor (``Repa.encoder_params``):
the loss closes over them, so ``jit`` takes them as constant inputs of the step. They are not
in the trained params, so the optimizer state, the EMA and every checkpoint hold exactly the
network REPA trains (and what REPA's checkpoints hold: its ``state_dict`` has no encoder),
no optimizer mask is needed, and a resumed run re-reads the same digest-checked file.

**Time.** dew's ``interpolant`` runs SiT's convention (t = 1 at the data, x_t = t·x + (1 − t)·ε,
u = x − ε); REPA's ``SILoss`` runs the other way (t = 0 at the data, x_t = (1 − t)·x + t·ε,
v = ε − x). On REPA's ``linear`` path with ``uniform`` weighting and SiT's Linear velocity
defaults (train_eps 0: t ~ U(0, 1)) the two are the same loss under t ↦ 1 − t and v ↦ −v
(tests/test_repa.py checks it against ``SILoss`` itself); a network trained by one predicts
the negated velocity at the mirrored time of the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dew.objectives.repa_encoders import RepresentationEncoder

NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize's default eps


def normalize(x: jax.Array) -> jax.Array:
    """``F.normalize(x, dim=-1)``: x / max(‖x‖₂, 1e−12)."""
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return x / jnp.maximum(norm, NORMALIZE_EPS)


def alignment_loss(zs: Sequence[jax.Array], zs_tilde: Sequence[jax.Array]) -> jax.Array:
    """``SILoss``'s ``proj_loss``: per encoder k and example b, the mean over tokens of the negative
    cosine similarity of z and z̃; summed over (k, b) and divided by K·B. A scalar."""
    if len(zs) != len(zs_tilde) or not zs:
        raise ValueError(f"alignment_loss: {len(zs)} target and {len(zs_tilde)} projected token sets")
    total = jnp.zeros((), jnp.float32)
    for z, z_tilde in zip(zs, zs_tilde, strict=True):
        if z.shape != z_tilde.shape:
            raise ValueError(
                f"alignment_loss: encoder tokens {z.shape} and projected tokens {z_tilde.shape} differ"
            )
        cosine = jnp.sum(normalize(z) * normalize(z_tilde), axis=-1)  # [B, T]
        total = total + jnp.sum(jnp.mean(-cosine, axis=-1))
    return total / (len(zs) * zs[0].shape[0])


@dataclasses.dataclass(frozen=True)
class Repa:
    """The REPA settings the ``interpolant`` objective is built with.

    ``encoder`` (a registered ``RepresentationEncoder``) with its loaded, frozen
    ``encoder_params``; ``image_field`` the batch field the encoder sees, in ``value_range``
    (REPA: the raw uint8 images beside the latents; in pixel space the sample itself);
    ``resolution`` the side REPA's resize rule reads (None: the images' own); ``encoder_depth``
    the block whose tokens are projected (1-based, REPA's ``(i + 1) == encoder_depth``);
    ``proj_coeff`` λ ≥ 0; ``projector_dim`` the projector MLP's hidden width; ``embed_dim`` and
    ``num_tokens`` the encoder's token shape (what the projector must produce)."""

    encoder: RepresentationEncoder
    encoder_params: Any
    embed_dim: int
    num_tokens: int
    image_field: str
    value_range: tuple[float, float] = (0.0, 255.0)
    resolution: int | None = None
    encoder_depth: int = 8
    proj_coeff: float = 0.5
    projector_dim: int = 2048

    def __post_init__(self) -> None:
        if self.proj_coeff < 0:
            raise ValueError(f"Repa: proj_coeff={self.proj_coeff} is invalid: expected a float >= 0")
        if self.encoder_depth < 1:
            raise ValueError(f"Repa: encoder_depth={self.encoder_depth} is invalid: expected an int >= 1")

    def network_options(self) -> dict[str, Any]:
        """What the DiT / SiT network is built with to return REPA's projected tokens."""
        return {
            "encoder_depth": self.encoder_depth,
            "projector_dims": (self.embed_dim,),
            "projector_hidden": self.projector_dim,
        }

    def targets(self, images: jax.Array, compute_dtype: Any = "float32") -> jax.Array:
        """The frozen encoder's tokens of ``images`` [B, T, D], float32 (no gradient flows into
        them); the encoder computes in ``compute_dtype``, the run's (``repa_encoders``)."""
        z = self.encoder.tokens(
            self.encoder_params, images, self.value_range, self.resolution, compute_dtype=compute_dtype
        )
        return jax.lax.stop_gradient(z.astype(jnp.float32))


def total_loss(
    transport: Any,
    network: Any,
    x1: jax.Array,
    t: jax.Array,
    x0: jax.Array,
    zs: Sequence[jax.Array],
    proj_coeff: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``train.py``'s ``loss_mean + proj_coeff · proj_loss_mean`` for given times ``t``, noise
    ``x0`` and encoder tokens ``zs``; ``network(x, t)`` returns (output, projected tokens). The
    denoising term is ``transport.training_losses`` (SiT's, for every path and prediction).
    Returns (loss, {"denoising": ..., "proj_loss": ...})."""
    projected: list[Sequence[jax.Array]] = []

    def model(x: jax.Array, tt: jax.Array) -> jax.Array:
        out, features = network(x, tt)
        projected.append(features)
        return out

    denoising = jnp.mean(transport.training_losses(model, x1, t, x0)["loss"])
    proj = alignment_loss(zs, projected[0])
    return denoising + proj_coeff * proj, {"denoising": denoising, "proj_loss": proj}
