"""``Process``: a noise schedule paired with what the network predicts and how the loss is
weighted, in the common frame of Karras et al. 2022 (EDM). Equation and table numbers refer to
that paper; "Table 1" is its summary of the design choices of VP, VE and EDM.

Every process is written in the σ-parameterisation x = y + σ n (EDM Eq. 1 with s(t) = 1), which
EDM shows loses nothing: VP's scaled samples and a rectified flow's x_t are rescalings of x (see
``dew.diffusion.targets``), so one set of samplers serves all of them. The network F_θ never sees
raw noisy data; the denoiser is (Eq. 7)

    D_θ(x; σ) = c_skip(σ) x + c_out(σ) F_θ(c_in(σ) x; c_noise(σ))

with c_skip and c_out fixed by the prediction target, and training minimises (Eq. 8)

    E_{σ ~ p_train, y, n} [ λ(σ) ‖D_θ(y + n; σ) − y‖² ],   n ~ N(0, σ² I).

λ(σ) = 1 / c_out(σ)², which turns Eq. 8 into an unweighted regression of F onto its target;
for the four presets this is exactly their λ (EDM's (σ²+σ_d²)/(σσ_d)², VP's and VE's 1/σ²,
the flow's 1/t²).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from dew.diffusion import schedules, targets

Array = jax.Array

#: c_in(σ) by ``input_scaling`` (Table 1, "Network and preconditioning").
INPUT_SCALING: dict[str, Callable[[Process, Array], Array]] = {
    "variance": lambda p, s: 1.0 / jnp.sqrt(s**2 + p.sigma_data**2),
    "none": lambda p, s: jnp.ones_like(s),
    "flow": lambda p, s: 1.0 / (1.0 + s),
}

#: c_noise(σ) by ``noise_embedding``.
NOISE_EMBEDDING: dict[str, Callable[[Process, Array], Array]] = {
    "edm": lambda p, s: jnp.log(s) / 4.0,
    "vp": lambda p, s: (p.m - 1) * schedules.vp_time(s, p.beta_d, p.beta_min),
    "ve": lambda p, s: jnp.log(0.5 * s),
    "flow": lambda p, s: 1000.0 * s / (1.0 + s),
}


def _lognormal(p: Process, rng: Array, batch: int) -> Array:
    return jnp.exp(p.p_mean + p.p_std * jax.random.normal(rng, (batch,)))


def _loguniform(p: Process, rng: Array, batch: int) -> Array:
    lo, hi = jnp.log(p.sigma_min), jnp.log(p.sigma_max)
    return jnp.exp(jax.random.uniform(rng, (batch,), minval=lo, maxval=hi))


def _vp_noise(p: Process, rng: Array, batch: int) -> Array:
    t = jax.random.uniform(rng, (batch,), minval=p.eps_t, maxval=1.0)
    return schedules.vp_sigma(t, p.beta_d, p.beta_min)


#: σ ~ p_train by ``training_noise`` (Table 1, "Training").
TRAINING_NOISE: dict[str, Callable[[Process, Array, int], Array]] = {
    "lognormal": _lognormal,
    "loguniform": _loguniform,
    "vp": _vp_noise,
}

#: The sampling discretisation by ``schedule`` (Eq. 5 and Table 1, "Sampling").
SCHEDULE: dict[str, Callable[[Process, int], Array]] = {
    "karras": lambda p, n: schedules.karras(n, p.sigma_min, p.sigma_max, p.rho),
    "uniform": lambda p, n: schedules.uniform(n, p.sigma_min, p.sigma_max),
    "geometric": lambda p, n: schedules.geometric(n, p.sigma_min, p.sigma_max),
    "vp": lambda p, n: schedules.vp(n, p.eps_s, p.beta_d, p.beta_min),
    "flow": lambda p, n: schedules.flow(n, p.sigma_min, p.sigma_max),
}

INPUT_SCALINGS, NOISE_EMBEDDINGS = tuple(INPUT_SCALING), tuple(NOISE_EMBEDDING)


def _one_of(field: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"Process.{field}={value!r} is unknown: expected one of {accepted}")


@dataclasses.dataclass(frozen=True)
class Process:
    """Pairs a schedule with what the model predicts on it and how the loss is weighted.

    The defaults are Table 1's EDM column. Fields:

    * ``target``: what F predicts, one of ``dew.diffusion.targets.TARGETS``;
    * ``sigma_data``: the data scale of the ``edm`` target and of ``variance`` input scaling;
    * ``training_noise``: p_train(σ): ``lognormal`` (ln σ ~ N(p_mean, p_std²); a logit-normal
      flow time t = σ/(1+σ) is this too), ``loguniform`` in [σ_min, σ_max] (VE), or ``vp``
      (t ~ U(ε_t, 1), σ = σ_vp(t));
    * ``schedule``: the sampling discretisation, one of ``schedules.SCHEDULES``;
    * ``input_scaling``: c_in: ``variance`` 1/√(σ²+σ_d²), ``none`` 1, ``flow`` 1/(1+σ);
    * ``noise_embedding``: c_noise: ``edm`` ¼ ln σ, ``vp`` (M−1) t_vp(σ), ``ve`` ln(σ/2),
      ``flow`` 1000 t.
    """

    target: str = "edm"
    sigma_data: float = 0.5
    training_noise: str = "lognormal"
    p_mean: float = -1.2
    p_std: float = 1.2
    schedule: str = "karras"
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    rho: float = 7.0
    input_scaling: str = "variance"
    noise_embedding: str = "edm"
    beta_d: float = 19.9
    beta_min: float = 0.1
    eps_s: float = 1e-3
    eps_t: float = 1e-5
    m: int = 1000

    def __post_init__(self) -> None:
        _one_of("target", self.target, targets.TARGETS)
        _one_of("training_noise", self.training_noise, tuple(TRAINING_NOISE))
        _one_of("schedule", self.schedule, tuple(SCHEDULE))
        _one_of("input_scaling", self.input_scaling, INPUT_SCALINGS)
        _one_of("noise_embedding", self.noise_embedding, NOISE_EMBEDDINGS)
        for name in ("sigma_data", "p_std", "sigma_min", "sigma_max", "rho"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Process.{name} must be > 0, got {getattr(self, name)}")
        if not self.sigma_min < self.sigma_max:
            raise ValueError(
                f"Process: sigma_min ({self.sigma_min}) must be below sigma_max ({self.sigma_max})"
            )

    # --- Table 1, "Network and preconditioning" ------------------------------------------------
    def c_skip(self, sigma: Array) -> Array:
        return targets.c_skip(self.target, sigma, self.sigma_data)

    def c_out(self, sigma: Array) -> Array:
        return targets.c_out(self.target, sigma, self.sigma_data)

    def c_in(self, sigma: Array) -> Array:
        return INPUT_SCALING[self.input_scaling](self, jnp.asarray(sigma))

    def c_noise(self, sigma: Array) -> Array:
        return NOISE_EMBEDDING[self.noise_embedding](self, jnp.asarray(sigma))

    # --- Table 1, "Training" --------------------------------------------------------------------
    def loss_weight(self, sigma: Array) -> Array:
        """λ(σ) = 1 / c_out(σ)²: unit weight on the error of the predicted target."""
        if self.target == "edm":  # Table 1's form of the same value, as the default run computes it
            return (sigma**2 + self.sigma_data**2) / (sigma * self.sigma_data) ** 2
        return 1.0 / self.c_out(sigma) ** 2

    def sample_training_sigma(self, rng: Array, batch: int) -> Array:
        """σ ~ p_train, [batch]."""
        return TRAINING_NOISE[self.training_noise](self, rng, batch)

    # --- Eq. 7 ----------------------------------------------------------------------------------
    def denoise(self, network: Callable[[Array, Array], Array], x: Array, sigma: Array) -> Array:
        """D(x; σ) from a raw network F(c_in x, c_noise); ``sigma`` is per example, [B]."""
        s = sigma.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
        raw = network(self.c_in(s) * x, self.c_noise(sigma).astype(x.dtype))
        return self.c_skip(s) * x + self.c_out(s) * raw

    # --- Eq. 5 and Table 1, "Sampling" -----------------------------------------------------------
    def sigmas(self, steps: int) -> Array:
        """``steps`` noise levels from σ_max down to σ_min on this process's schedule.

        For ``karras`` this is Eq. 5. The paper's final σ = 0 is not included: the sampler ends on
        the model's clean prediction at the last point instead.
        """
        if steps < 2:
            raise ValueError(f"sigmas: steps must be >= 2 (T and the last point), got {steps}")
        return SCHEDULE[self.schedule](self, steps)


EDM = Process()
"""Table 1's "EDM" column: σ_data 0.5, P_mean −1.2, P_std 1.2, σ ∈ [0.002, 80], ρ 7."""

VP = Process(
    target="eps",
    sigma_data=1.0,  # c_in = 1/√(σ²+1)
    training_noise="vp",
    schedule="vp",
    input_scaling="variance",
    noise_embedding="vp",
    sigma_min=math.sqrt(math.expm1(0.5 * 19.9 * 1e-3**2 + 0.1 * 1e-3)),  # σ(ε_s), no JAX at import
    sigma_max=math.sqrt(math.expm1(0.5 * 19.9 + 0.1)),  # σ(1)
)
"""Table 1's "VP" column (DDPM++, Song et al. 2021): ε-prediction, t ~ U(ε_t, 1), λ = 1/σ²,
σ(t) = √(e^{½β_d t² + β_min t} − 1) with β_d 19.9, β_min 0.1, sampled at t_i from 1 to ε_s = 10⁻³."""

VE = Process(
    target="eps",
    training_noise="loguniform",
    schedule="geometric",
    input_scaling="none",
    noise_embedding="ve",
    sigma_min=0.02,
    sigma_max=100.0,
)
"""Table 1's "VE" column (NCSN++): c_skip 1, c_in 1, c_noise ln(σ/2), ln σ ~ U(ln σ_min, ln σ_max),
λ = 1/σ², geometric σ steps in [0.02, 100]. Table 1 writes c_out = +σ (F predicts −n); dew's
``eps`` target is the same network up to the sign of its output layer."""

FLOW = Process(
    target="flow",
    training_noise="lognormal",
    p_mean=0.0,
    p_std=1.0,
    schedule="flow",
    input_scaling="flow",
    noise_embedding="flow",
    sigma_min=0.002,
    sigma_max=200.0,
)
"""Rectified flow / flow matching (Liu et al. 2022; Lipman et al. 2022) with the logit-normal
time sampling of Esser et al. 2024: x_t = (1−t) y + t n, the network predicts u = n − y, t ~
logit-N(0, 1) (i.e. σ = t/(1−t) is lognormal with P_mean 0, P_std 1), loss ‖F − u‖², and equal
steps in t from t(σ_max) = 0.995 to t(σ_min)."""
