"""Stochastic interpolants (Ma et al. 2024, SiT; willisma/SiT ``transport/path.py``), exact to the
reference's arithmetic.

SiT's time runs the other way from EDM's σ: t = 0 is noise x0 ~ N(0, I), t = 1 is data x1, and

    x_t = α_t x1 + σ_t x0,        u_t = dx_t/dt = α̇_t x1 + σ̇_t x0.

The three paths (``PATHS``), with the reference's plan names:

* ``Linear`` (``ICPlan``):  α_t = t,            σ_t = 1 − t;
* ``GVP``    (``GVPCPlan``): α_t = sin(πt/2),    σ_t = cos(πt/2);
* ``VP``     (``VPCPlan``):  α_t = e^{m(t)},      σ_t = √(1 − e^{2m(t)}),
  m(t) = −¼ (1−t)² (β_max − β_min) − ½ (1−t) β_min  (β_min 0.1, β_max 20: the reference's
  ``sigma_min``/``sigma_max``).

Each is a rescaling of dew's σ-parameterisation x = y + σ n (``dew.diffusion.process``):
x_t = α_t (x1 + (σ_t/α_t) x0), so x_t is dew's x at σ = σ_t/α_t scaled by s = α_t
(``Path.edm_sigma``). The Linear path is dew's rectified flow (``targets``' x_t = x/(1+σ)) with
flow time 1 − t; the VP path is exactly dew's VP preset: σ_t/α_t = ``schedules.vp_sigma(1 − t,
β_d = β_max − β_min, β_min)``, the same function (reused here, and tested to agree); GVP is the
variance-preserving path with σ = cot(πt/2). The coefficients below are computed as the reference
computes them (not through σ) so that training targets match it to float32 roundoff.

``Path.drift(x, t)`` is the reference's ``compute_drift``: a pair (d, g) with which the
probability-flow velocity is v = g · score − d: d = −(α̇/α) x and g = (α̇/α) σ² − σ σ̇ for Linear
and GVP; d = −½ β_t x and g = β_t / 2 for VP.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from dew.diffusion import schedules
from dew.schema import ConfigError

Array = jax.Array

#: The reference's ``compute_diffusion`` forms, by name. ``increasing-decreasing`` is the form the
#: reference's command line offers; its ``path.py`` spells the key ``inccreasing-decreasing`` (so
#: the reference itself refuses the command-line name); both spellings are accepted here.
DIFFUSION_FORMS = ("constant", "SBDM", "sigma", "linear", "decreasing", "increasing-decreasing")
DIFFUSION_ALIASES = {"inccreasing-decreasing": "increasing-decreasing"}


def expand_t_like_x(t: Array, x: Array) -> Array:
    """t of shape [B] as [B, 1, ...] to broadcast against x (a t already expanded is kept)."""
    t = jnp.asarray(t)
    if t.ndim == x.ndim:
        return t
    return t.reshape((t.shape[0],) + (1,) * (x.ndim - 1))


def one_of(field: str, value: object, accepted: tuple) -> None:
    """Raise the one-line ``ConfigError`` for a name that is not among ``accepted``."""
    if value not in accepted:
        raise ConfigError(f"{field}={value!r} is unknown: expected one of {list(accepted)}")


@dataclasses.dataclass(frozen=True)
class Path:
    """A coupling plan x_t = α_t x1 + σ_t x0; subclasses give α, σ and their derivatives."""

    name = "path"

    def alpha(self, t: Array) -> tuple[Array, Array | float]:
        """(α_t, α̇_t): the data coefficient and its derivative."""
        raise NotImplementedError

    def sigma(self, t: Array) -> tuple[Array, Array | float]:
        """(σ_t, σ̇_t): the noise coefficient and its derivative."""
        raise NotImplementedError

    def d_alpha_alpha_ratio(self, t: Array) -> Array:
        """α̇_t / α_t in the reference's numerically stable form."""
        raise NotImplementedError

    def drift(self, x: Array, t: Array) -> tuple[Array, Array]:
        """``compute_drift``: (−(α̇/α) x, (α̇/α) σ² − σ σ̇)."""
        t = expand_t_like_x(t, x)
        ratio = self.d_alpha_alpha_ratio(t)
        sigma_t, d_sigma_t = self.sigma(t)
        return -(ratio * x), ratio * (sigma_t**2) - sigma_t * d_sigma_t

    def diffusion(self, x: Array, t: Array, form: str = "SBDM", norm: float = 1.0) -> Array:
        """``compute_diffusion``: the SDE's w(t) (it enters as √(2 w) dW), by ``form``:
        constant ``norm``; SBDM ``norm · g(t)`` (the drift's second term); sigma ``norm · σ_t``;
        linear ``norm (1 − t)``; decreasing ``¼ (norm cos(πt) + 1)²``; increasing-decreasing
        ``norm sin²(πt)``."""
        form = DIFFUSION_ALIASES.get(form, form)
        one_of("diffusion_form", form, DIFFUSION_FORMS)
        t = expand_t_like_x(t, x)
        if form == "constant":
            return jnp.broadcast_to(jnp.asarray(norm, x.dtype), t.shape)
        if form == "SBDM":
            return norm * self.drift(x, t)[1]
        if form == "sigma":
            return norm * self.sigma(t)[0]
        if form == "linear":
            return norm * (1 - t)
        if form == "decreasing":
            return 0.25 * (norm * jnp.cos(math.pi * t) + 1) ** 2
        return norm * jnp.sin(math.pi * t) ** 2

    # --- conversions between what a network predicts ---------------------------------------------
    def score_from_velocity(self, velocity: Array, x: Array, t: Array) -> Array:
        """``get_score_from_velocity``: s = (α/α̇ · v − x) / (σ² − α/α̇ · σ̇ σ)."""
        t = expand_t_like_x(t, x)
        alpha_t, d_alpha_t = self.alpha(t)
        sigma_t, d_sigma_t = self.sigma(t)
        reverse_alpha_ratio = alpha_t / d_alpha_t
        var = sigma_t**2 - reverse_alpha_ratio * d_sigma_t * sigma_t
        return (reverse_alpha_ratio * velocity - x) / var

    def noise_from_velocity(self, velocity: Array, x: Array, t: Array) -> Array:
        """``get_noise_from_velocity``: ε = (α/α̇ · v − x) / (α/α̇ · σ̇ − σ)."""
        t = expand_t_like_x(t, x)
        alpha_t, d_alpha_t = self.alpha(t)
        sigma_t, d_sigma_t = self.sigma(t)
        reverse_alpha_ratio = alpha_t / d_alpha_t
        var = reverse_alpha_ratio * d_sigma_t - sigma_t
        return (reverse_alpha_ratio * velocity - x) / var

    def velocity_from_score(self, score: Array, x: Array, t: Array) -> Array:
        """``get_velocity_from_score``: v = g s − drift."""
        drift, var = self.drift(x, expand_t_like_x(t, x))
        return var * score - drift

    # --- the plan ---------------------------------------------------------------------------------
    def xt(self, t: Array, x0: Array, x1: Array) -> Array:
        """``compute_mu_t`` (= ``compute_xt``): α_t x1 + σ_t x0."""
        t = expand_t_like_x(t, x1)
        return self.alpha(t)[0] * x1 + self.sigma(t)[0] * x0

    def ut(self, t: Array, x0: Array, x1: Array) -> Array:
        """``compute_ut``: α̇_t x1 + σ̇_t x0."""
        t = expand_t_like_x(t, x1)
        return self.alpha(t)[1] * x1 + self.sigma(t)[1] * x0

    def plan(self, t: Array, x0: Array, x1: Array) -> tuple[Array, Array, Array]:
        """(t, x_t, u_t)."""
        return t, self.xt(t, x0, x1), self.ut(t, x0, x1)

    def edm_sigma(self, t: Array) -> Array:
        """σ_t / α_t: the noise level of dew's σ-parameterisation x_t / α_t = x1 + σ x0."""
        return self.sigma(t)[0] / self.alpha(t)[0]


@dataclasses.dataclass(frozen=True)
class LinearPath(Path):
    """``ICPlan``: α = t, σ = 1 − t (dew's rectified flow with flow time 1 − t, σ = (1 − t)/t)."""

    name = "Linear"

    def alpha(self, t):
        return t, 1

    def sigma(self, t):
        return 1 - t, -1

    def d_alpha_alpha_ratio(self, t):
        return 1 / t

    def edm_sigma(self, t):
        return (1 - t) / t


@dataclasses.dataclass(frozen=True)
class GVPPath(Path):
    """``GVPCPlan``: α = sin(πt/2), σ = cos(πt/2) (variance preserving; σ_dew = cot(πt/2))."""

    name = "GVP"

    def alpha(self, t):
        return jnp.sin(t * math.pi / 2), math.pi / 2 * jnp.cos(t * math.pi / 2)

    def sigma(self, t):
        return jnp.cos(t * math.pi / 2), -math.pi / 2 * jnp.sin(t * math.pi / 2)

    def d_alpha_alpha_ratio(self, t):
        return math.pi / (2 * jnp.tan(t * math.pi / 2))


@dataclasses.dataclass(frozen=True)
class VPPath(Path):
    """``VPCPlan``: the VP SDE of Song et al. 2021 in SiT's time, β_t = β_min + (1 − t)(β_max − β_min).

    σ_t/α_t = ``dew.diffusion.schedules.vp_sigma(1 − t, β_max − β_min, β_min)``: dew's VP preset
    (``edm_sigma`` is that function)."""

    beta_min: float = 0.1  # the reference's sigma_min
    beta_max: float = 20.0  # the reference's sigma_max
    name = "VP"

    def log_mean_coeff(self, t: Array) -> Array:
        return -0.25 * ((1 - t) ** 2) * (self.beta_max - self.beta_min) - 0.5 * (1 - t) * self.beta_min

    def d_log_mean_coeff(self, t: Array) -> Array:
        return 0.5 * (1 - t) * (self.beta_max - self.beta_min) + 0.5 * self.beta_min

    def alpha(self, t):
        alpha_t = jnp.exp(self.log_mean_coeff(t))
        return alpha_t, alpha_t * self.d_log_mean_coeff(t)

    def sigma(self, t):
        p_sigma_t = 2 * self.log_mean_coeff(t)
        sigma_t = jnp.sqrt(1 - jnp.exp(p_sigma_t))
        d_sigma_t = jnp.exp(p_sigma_t) * (2 * self.d_log_mean_coeff(t)) / (-2 * sigma_t)
        return sigma_t, d_sigma_t

    def d_alpha_alpha_ratio(self, t):
        return self.d_log_mean_coeff(t)

    def drift(self, x, t):
        t = expand_t_like_x(t, x)
        beta_t = self.beta_min + (1 - t) * (self.beta_max - self.beta_min)
        return -0.5 * beta_t * x, beta_t / 2

    def edm_sigma(self, t):
        return schedules.vp_sigma(1 - t, self.beta_max - self.beta_min, self.beta_min)


PATHS: dict[str, type[Path]] = {"Linear": LinearPath, "GVP": GVPPath, "VP": VPPath}
PREDICTIONS = ("velocity", "score", "noise")
LOSS_WEIGHTS = (None, "velocity", "likelihood")
