"""The EDM formulation (Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based
Generative Models"), written as the paper's equations. Equation and table numbers refer to that
paper; "Table 1" is its summary of design choices.

The network F_θ never sees raw noisy data. The denoiser is (Eq. 7)

    D_θ(x; σ) = c_skip(σ) x + c_out(σ) F_θ(c_in(σ) x; c_noise(σ))

and training minimises (Eq. 8, with Table 1's λ and p_train)

    E_{σ, y, n} [ λ(σ) ‖D_θ(y + n; σ) − y‖² ],   ln σ ~ N(P_mean, P_std²),  n ~ N(0, σ² I).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Process:
    """Pairs a schedule with what the model predicts on it and how the loss is weighted.

    Only the EDM parameterisation (the network predicts through c_skip/c_out towards the clean
    sample) is built so far; VP, VE and flow presets land with the diffusion issue.
    """

    sigma_data: float = 0.5
    p_mean: float = -1.2
    p_std: float = 1.2
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    rho: float = 7.0

    def __post_init__(self) -> None:
        for name in ("sigma_data", "p_std", "sigma_min", "sigma_max", "rho"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Process.{name} must be > 0, got {getattr(self, name)}")
        if not self.sigma_min < self.sigma_max:
            raise ValueError(
                f"Process: sigma_min ({self.sigma_min}) must be below sigma_max ({self.sigma_max})"
            )

    # --- Table 1, "Network and preconditioning" ------------------------------------------------
    def c_skip(self, sigma: Array) -> Array:
        return self.sigma_data**2 / (sigma**2 + self.sigma_data**2)

    def c_out(self, sigma: Array) -> Array:
        return sigma * self.sigma_data / jnp.sqrt(sigma**2 + self.sigma_data**2)

    def c_in(self, sigma: Array) -> Array:
        return 1.0 / jnp.sqrt(sigma**2 + self.sigma_data**2)

    def c_noise(self, sigma: Array) -> Array:
        return jnp.log(sigma) / 4.0

    # --- Table 1, "Training" --------------------------------------------------------------------
    def loss_weight(self, sigma: Array) -> Array:
        """λ(σ) = (σ² + σ_data²) / (σ σ_data)², which makes the effective target unit-variance."""
        return (sigma**2 + self.sigma_data**2) / (sigma * self.sigma_data) ** 2

    def sample_training_sigma(self, rng: Array, batch: int) -> Array:
        """ln σ ~ N(P_mean, P_std²)."""
        return jnp.exp(self.p_mean + self.p_std * jax.random.normal(rng, (batch,)))

    # --- Eq. 7 ----------------------------------------------------------------------------------
    def denoise(self, network: Callable[[Array, Array], Array], x: Array, sigma: Array) -> Array:
        """D(x; σ) from a raw network F(c_in x, c_noise); ``sigma`` is per example, [B]."""
        s = sigma.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
        raw = network(self.c_in(s) * x, self.c_noise(sigma).astype(x.dtype))
        return self.c_skip(s) * x + self.c_out(s) * raw

    # --- Eq. 5, the sampling-time discretisation -----------------------------------------------
    def sigmas(self, steps: int) -> Array:
        """``steps`` noise levels from σ_max down to σ_min, spaced by Eq. 5 with exponent ρ.

        σ_i = (σ_max^{1/ρ} + i/(N−1) (σ_min^{1/ρ} − σ_max^{1/ρ}))^ρ. The final σ = 0 of the paper
        is not included: the sampler ends on the model's clean prediction at σ_min instead.
        """
        if steps < 2:
            raise ValueError(f"sigmas: steps must be >= 2 (T and the last point), got {steps}")
        ramp = jnp.linspace(0.0, 1.0, steps)
        lo, hi = self.sigma_min ** (1 / self.rho), self.sigma_max ** (1 / self.rho)
        return (hi + ramp * (lo - hi)) ** self.rho


EDM = Process()
"""The preset of Table 1's "EDM" column: σ_data 0.5, P_mean −1.2, P_std 1.2, σ ∈ [0.002, 80], ρ 7."""
