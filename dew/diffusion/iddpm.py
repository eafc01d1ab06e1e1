"""DiT's diffusion process: improved DDPM (Nichol & Dhariwal 2021) as facebookresearch/DiT's
``diffusion/`` builds it (``create_diffusion``, ``gaussian_diffusion.py``, ``respace.py``), exact
to its arithmetic: float64 tables, gathered per timestep and cast to float32.

The forward process over T steps of β_t (1,000 linear steps from 10⁻⁴ to 0.02 by default):

    q(x_t | x_0) = N(√ᾱ_t x_0, (1 − ᾱ_t) I),   ᾱ_t = Π_{s<=t} (1 − β_s),

with the posterior q(x_{t−1} | x_t, x_0) = N(c1 x_0 + c2 x_t, β̃_t I). The network predicts ε
(or x_0) and, with ``learn_sigma`` (``LEARNED_RANGE``), a second half of channels v ∈ [−1, 1]
that interpolates the log-variance between β̃_t and β_t:
log σ² = ½(v + 1) log β_t + (1 − ½(v + 1)) log β̃_t. Training minimises the hybrid loss
``mse + vb``: ‖ε − ε_θ‖² (mean over elements) plus the VLB term in bits per dimension of the
variance half with the mean half's gradient stopped (KL to the posterior, or the discretised
Gaussian decoder NLL at t = 0); ``rescale_learned_sigmas`` (``RESCALED_MSE``) scales that term by
T/1000.

Respacing (``space_timesteps``, e.g. "250" or "ddim50") keeps a subset of the steps and re-derives
β from the kept ᾱ's; the network is then called with the ORIGINAL step index of each kept step
(``timestep_map``), as the reference's ``_WrappedModel`` does. Images are channel-last here: the
learned-variance half is split on the last axis (the reference splits NCHW's axis 1).

A model is ``model(x, t)`` with t the original step index as float32, [B]; sampling functions
take their per-step noise as arguments (or draw it from an rng), so runs are reproducible.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dew.diffusion.interpolants import one_of
from dew.schema import ConfigError

Array = jax.Array
Model = Callable[[Array, Array], Array]

MEAN_TYPES = ("epsilon", "start_x")
VAR_TYPES = ("learned_range", "fixed_small", "fixed_large")
LOSS_TYPES = ("mse", "rescaled_mse", "kl", "rescaled_kl")
SCHEDULES = ("linear", "squaredcos_cap_v2")


def named_betas(schedule: str, steps: int) -> np.ndarray:
    """``get_named_beta_schedule``: ``linear`` (Ho et al., scaled by 1000/T) or
    ``squaredcos_cap_v2`` (the cosine schedule, β capped at 0.999), float64."""
    one_of("noise_schedule", schedule, SCHEDULES)
    if schedule == "linear":
        scale = 1000 / steps
        return np.linspace(scale * 0.0001, scale * 0.02, steps, dtype=np.float64)

    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    return np.array([min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), 0.999) for i in range(steps)])


def space_timesteps(num_timesteps: int, section_counts: str | list[int]) -> list[int]:
    """``respace.space_timesteps``, sorted: ``section_counts`` steps taken at equal fractional
    strides from equal portions of the process ("10,15,20"), or "ddimN": the integer stride
    giving exactly N steps."""
    if isinstance(section_counts, str):
        if section_counts.startswith("ddim"):
            desired = int(section_counts[len("ddim") :])
            for i in range(1, num_timesteps):
                if len(range(0, num_timesteps, i)) == desired:
                    return list(range(0, num_timesteps, i))
            raise ConfigError(
                f"timestep_respacing={section_counts!r} is invalid: no integer stride gives exactly "
                f"{desired} of {num_timesteps} steps"
            )
        section_counts = [int(x) for x in section_counts.split(",")]
    size_per, extra = divmod(num_timesteps, len(section_counts))
    start, steps = 0, []
    for i, count in enumerate(section_counts):
        size = size_per + (1 if i < extra else 0)
        if size < count or count < 1:
            raise ConfigError(
                f"timestep_respacing={section_counts!r} is invalid: cannot divide a section of {size} "
                f"steps into {count}; expected 1 to {size} steps per section"
            )
        stride = 1 if count <= 1 else (size - 1) / (count - 1)
        cur = 0.0
        for _ in range(count):
            steps.append(start + round(cur))
            cur += stride
        start += size
    return sorted(set(steps))


@functools.lru_cache(maxsize=16)
def _tables(betas: tuple[float, ...]) -> dict[str, np.ndarray]:
    """The reference's float64 coefficient tables for ``betas``."""
    b = np.asarray(betas, np.float64)
    alphas = 1.0 - b
    ac = np.cumprod(alphas, axis=0)
    ac_prev = np.append(1.0, ac[:-1])
    ac_next = np.append(ac[1:], 0.0)
    posterior_variance = b * (1.0 - ac_prev) / (1.0 - ac)
    clipped = np.log(np.append(posterior_variance[1], posterior_variance[1:])) if len(b) > 1 else np.array([])
    large = np.append(posterior_variance[1], b[1:])
    return {
        "betas": b,
        "log_betas": np.log(b),
        "alphas_cumprod": ac,
        "alphas_cumprod_prev": ac_prev,
        "alphas_cumprod_next": ac_next,
        "sqrt_alphas_cumprod": np.sqrt(ac),
        "sqrt_one_minus_alphas_cumprod": np.sqrt(1.0 - ac),
        "sqrt_recip_alphas_cumprod": np.sqrt(1.0 / ac),
        "sqrt_recipm1_alphas_cumprod": np.sqrt(1.0 / ac - 1),
        "posterior_variance": posterior_variance,
        "posterior_log_variance_clipped": clipped,
        "posterior_mean_coef1": b * np.sqrt(ac_prev) / (1.0 - ac),
        "posterior_mean_coef2": (1.0 - ac_prev) * np.sqrt(alphas) / (1.0 - ac),
        "fixed_large_variance": large,
        "fixed_large_log_variance": np.log(large),
    }


def mean_flat(x: Array) -> Array:
    return jnp.mean(x, axis=tuple(range(1, x.ndim)))


def normal_kl(mean1: Array, logvar1: Array, mean2: Array, logvar2: Array) -> Array:
    """KL(N(mean1, e^{logvar1}) ‖ N(mean2, e^{logvar2})), elementwise, in nats."""
    return 0.5 * (
        -1.0 + logvar2 - logvar1 + jnp.exp(logvar1 - logvar2) + ((mean1 - mean2) ** 2) * jnp.exp(-logvar2)
    )


def approx_standard_normal_cdf(x: Array) -> Array:
    """The tanh approximation of Φ the reference uses."""
    return 0.5 * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def discretized_gaussian_log_likelihood(x: Array, means: Array, log_scales: Array) -> Array:
    """log P(x) of a Gaussian discretised to 8-bit bins of [−1, 1] (open-ended at the edges)."""
    centered = x - means
    inv_stdv = jnp.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_stdv * (centered - 1.0 / 255.0))
    log_cdf_plus = jnp.log(jnp.maximum(cdf_plus, 1e-12))
    log_one_minus_cdf_min = jnp.log(jnp.maximum(1.0 - cdf_min, 1e-12))
    log_delta = jnp.log(jnp.maximum(cdf_plus - cdf_min, 1e-12))
    return jnp.where(x < -0.999, log_cdf_plus, jnp.where(x > 0.999, log_one_minus_cdf_min, log_delta))


@dataclasses.dataclass(frozen=True)
class GaussianDiffusion:
    """One (possibly respaced) IDDPM process; build it with ``GaussianDiffusion.create``.

    ``betas`` are the process's own (re-derived when respaced), ``timestep_map`` the original
    index of each of its steps; ``mean_type`` ∈ ``MEAN_TYPES``, ``var_type`` ∈ ``VAR_TYPES``,
    ``loss_type`` ∈ ``LOSS_TYPES``.
    """

    betas: tuple[float, ...]
    timestep_map: tuple[int, ...]
    mean_type: str = "epsilon"
    var_type: str = "learned_range"
    loss_type: str = "mse"

    def __post_init__(self) -> None:
        one_of("model_mean_type", self.mean_type, MEAN_TYPES)
        one_of("model_var_type", self.var_type, VAR_TYPES)
        one_of("loss_type", self.loss_type, LOSS_TYPES)
        if len(self.betas) != len(self.timestep_map) or not self.betas:
            raise ValueError(f"GaussianDiffusion: {len(self.betas)} betas for {len(self.timestep_map)} steps")
        if not all(0 < b <= 1 for b in self.betas):
            raise ValueError("GaussianDiffusion: betas must lie in (0, 1]")

    @classmethod
    def create(
        cls,
        timestep_respacing: str | list[int] | None = "",
        noise_schedule: str = "linear",
        use_kl: bool = False,
        sigma_small: bool = False,
        predict_xstart: bool = False,
        learn_sigma: bool = True,
        rescale_learned_sigmas: bool = False,
        diffusion_steps: int = 1000,
    ) -> GaussianDiffusion:
        """DiT's ``create_diffusion`` with its defaults: 1,000 linear steps, ε prediction, learned
        range variance, MSE + VLB. ``timestep_respacing`` "" (or None) keeps every step; "250"
        (DiT's sampling) keeps 250 evenly spaced ones."""
        if not (isinstance(diffusion_steps, int) and diffusion_steps >= 2):
            raise ConfigError(f"diffusion_steps={diffusion_steps!r} is invalid: expected an int >= 2")
        betas = named_betas(noise_schedule, diffusion_steps)
        loss = "rescaled_kl" if use_kl else ("rescaled_mse" if rescale_learned_sigmas else "mse")
        if timestep_respacing is None or timestep_respacing == "":
            timestep_respacing = [diffusion_steps]
        use = space_timesteps(diffusion_steps, timestep_respacing)
        # SpacedDiffusion: β re-derived from the kept ᾱ's.
        last, new_betas, kept = 1.0, [], set(use)
        for i, a in enumerate(np.cumprod(1.0 - betas)):
            if i in kept:
                new_betas.append(1 - a / last)
                last = a
        var = ("fixed_small" if sigma_small else "fixed_large") if not learn_sigma else "learned_range"
        return cls(
            tuple(float(b) for b in new_betas),
            tuple(use),
            "start_x" if predict_xstart else "epsilon",
            var,
            loss,
        )

    @property
    def num_timesteps(self) -> int:
        return len(self.betas)

    @property
    def tables(self) -> dict[str, np.ndarray]:
        """The float64 coefficient tables (``alphas_cumprod``, ``posterior_variance``, ...)."""
        return _tables(self.betas)

    def _extract(self, name: str, t: Array, x: Array) -> Array:
        """``_extract_into_tensor``: table[t] cast to float32, shaped [B, 1, ...] like x."""
        values = jnp.asarray(self.tables[name].astype(np.float32))[t]
        return values.reshape((t.shape[0],) + (1,) * (x.ndim - 1))

    def model_timesteps(self, t: Array) -> Array:
        """The original step index of each step t (the reference's ``_WrappedModel``), float32."""
        return jnp.asarray(self.timestep_map, jnp.float32)[t]

    def sample_timesteps(self, rng: Array, batch: int) -> Array:
        """DiT's ``torch.randint(0, num_timesteps, (B,))``: uniform step indices, int32."""
        return jax.random.randint(rng, (batch,), 0, self.num_timesteps)

    # --- the forward process -----------------------------------------------------------------------
    def q_sample(self, x_start: Array, t: Array, noise: Array) -> Array:
        """√ᾱ_t x_0 + √(1 − ᾱ_t) ε."""
        return (
            self._extract("sqrt_alphas_cumprod", t, x_start) * x_start
            + self._extract("sqrt_one_minus_alphas_cumprod", t, x_start) * noise
        )

    def q_posterior_mean_variance(self, x_start: Array, x_t: Array, t: Array) -> tuple[Array, Array, Array]:
        """q(x_{t−1} | x_t, x_0): (mean, variance, clipped log-variance)."""
        mean = (
            self._extract("posterior_mean_coef1", t, x_t) * x_start
            + self._extract("posterior_mean_coef2", t, x_t) * x_t
        )
        variance = self._extract("posterior_variance", t, x_t) + jnp.zeros_like(x_t)
        log_variance = self._extract("posterior_log_variance_clipped", t, x_t) + jnp.zeros_like(x_t)
        return mean, variance, log_variance

    def predict_xstart_from_eps(self, x_t: Array, t: Array, eps: Array) -> Array:
        return (
            self._extract("sqrt_recip_alphas_cumprod", t, x_t) * x_t
            - self._extract("sqrt_recipm1_alphas_cumprod", t, x_t) * eps
        )

    def predict_eps_from_xstart(self, x_t: Array, t: Array, pred_xstart: Array) -> Array:
        return (self._extract("sqrt_recip_alphas_cumprod", t, x_t) * x_t - pred_xstart) / self._extract(
            "sqrt_recipm1_alphas_cumprod", t, x_t
        )

    # --- the reverse process -----------------------------------------------------------------------
    def p_mean_variance_from_output(
        self, output: Array, x: Array, t: Array, clip_denoised: bool = True
    ) -> dict[str, Array]:
        """``p_mean_variance`` for the network's ``output`` at (x, t): mean, variance,
        log_variance and pred_xstart of p(x_{t−1} | x_t). With a learned variance ``output`` has
        twice x's channels (last axis)."""
        if self.var_type == "learned_range":
            if output.shape != (*x.shape[:-1], 2 * x.shape[-1]):
                raise ValueError(
                    f"p_mean_variance: output shape {output.shape} for x {x.shape}, expected 2C channels"
                )
            output, var_values = jnp.split(output, 2, axis=-1)
            min_log = self._extract("posterior_log_variance_clipped", t, x)
            max_log = self._extract("log_betas", t, x)
            frac = (var_values + 1) / 2
            log_variance = frac * max_log + (1 - frac) * min_log
            variance = jnp.exp(log_variance)
        else:
            prefix = "posterior" if self.var_type == "fixed_small" else "fixed_large"
            variance = self._extract(f"{prefix}_variance", t, x) + jnp.zeros_like(x)
            log_name = (
                "posterior_log_variance_clipped" if prefix == "posterior" else "fixed_large_log_variance"
            )
            log_variance = self._extract(log_name, t, x) + jnp.zeros_like(x)
        pred_xstart = output if self.mean_type == "start_x" else self.predict_xstart_from_eps(x, t, output)
        if clip_denoised:
            pred_xstart = jnp.clip(pred_xstart, -1, 1)
        mean, _, _ = self.q_posterior_mean_variance(pred_xstart, x, t)
        return {"mean": mean, "variance": variance, "log_variance": log_variance, "pred_xstart": pred_xstart}

    def p_mean_variance(
        self, model: Model, x: Array, t: Array, clip_denoised: bool = True
    ) -> dict[str, Array]:
        """``p_mean_variance`` calling ``model`` at the original step indices."""
        return self.p_mean_variance_from_output(model(x, self.model_timesteps(t)), x, t, clip_denoised)

    def vb_terms_bpd(self, output: Array, x_start: Array, x_t: Array, t: Array, clip_denoised: bool) -> Array:
        """The VLB term in bits per dimension, [B]: the decoder NLL at t = 0, else the KL of the
        posterior to p(x_{t−1} | x_t)."""
        true_mean, _, true_log_variance = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self.p_mean_variance_from_output(output, x_t, t, clip_denoised)
        kl = mean_flat(normal_kl(true_mean, true_log_variance, out["mean"], out["log_variance"])) / np.log(
            2.0
        )
        nll = -discretized_gaussian_log_likelihood(x_start, out["mean"], 0.5 * out["log_variance"])
        return jnp.where(t == 0, mean_flat(nll) / np.log(2.0), kl)

    def training_losses(self, model: Model, x_start: Array, t: Array, noise: Array) -> dict[str, Array]:
        """``training_losses``: {"loss", and for MSE losses "mse" and (learned variance) "vb"},
        each [B]. The VLB term sees the mean half through ``stop_gradient`` (the reference's
        ``detach``), so it trains only the variance."""
        x_t = self.q_sample(x_start, t, noise)
        output = model(x_t, self.model_timesteps(t))
        if self.loss_type in ("kl", "rescaled_kl"):
            loss = self.vb_terms_bpd(output, x_start, x_t, t, clip_denoised=False)
            return {"loss": loss * self.num_timesteps if self.loss_type == "rescaled_kl" else loss}
        terms = {}
        if self.var_type == "learned_range":
            mean_part, var_part = jnp.split(output, 2, axis=-1)
            frozen = jnp.concatenate([jax.lax.stop_gradient(mean_part), var_part], axis=-1)
            vb = self.vb_terms_bpd(frozen, x_start, x_t, t, clip_denoised=False)
            if self.loss_type == "rescaled_mse":
                vb = vb * (self.num_timesteps / 1000.0)
            terms["vb"] = vb
            output = mean_part
        target = x_start if self.mean_type == "start_x" else noise
        terms["mse"] = mean_flat((target - output) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"] if "vb" in terms else terms["mse"]
        return terms

    # --- sampling ----------------------------------------------------------------------------------
    def p_sample(self, model: Model, x: Array, t: Array, noise: Array, clip_denoised: bool = True):
        """One ancestral step x_t -> x_{t−1}: (sample, pred_xstart); no noise at t = 0."""
        out = self.p_mean_variance(model, x, t, clip_denoised)
        nonzero = (t != 0).astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))
        return out["mean"] + nonzero * jnp.exp(0.5 * out["log_variance"]) * noise, out["pred_xstart"]

    def ddim_sample(
        self, model: Model, x: Array, t: Array, noise: Array, clip_denoised=True, eta: float = 0.0
    ):
        """One DDIM step (Song et al. 2021, Eq. 12): (sample, pred_xstart)."""
        out = self.p_mean_variance(model, x, t, clip_denoised)
        eps = self.predict_eps_from_xstart(x, t, out["pred_xstart"])
        alpha_bar = self._extract("alphas_cumprod", t, x)
        alpha_bar_prev = self._extract("alphas_cumprod_prev", t, x)
        sigma = (
            eta * jnp.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar)) * jnp.sqrt(1 - alpha_bar / alpha_bar_prev)
        )
        mean_pred = (
            out["pred_xstart"] * jnp.sqrt(alpha_bar_prev) + jnp.sqrt(1 - alpha_bar_prev - sigma**2) * eps
        )
        nonzero = (t != 0).astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))
        return mean_pred + nonzero * sigma * noise, out["pred_xstart"]

    def sample_loop(
        self,
        model: Model,
        noise: Array,
        *,
        rng: Array | None = None,
        step_noises: Array | None = None,
        clip_denoised: bool = True,
        method: str = "ddpm",
        eta: float = 0.0,
        trajectory: bool = True,
    ) -> Array:
        """``p_sample_loop`` (``method="ddpm"``) or ``ddim_sample_loop`` (``"ddim"``) from
        ``noise`` at the last step down to step 0: the states after each step,
        [num_timesteps, *noise.shape] (the last row is the sample), or with ``trajectory=False``
        only the sample (no [num_timesteps, ...] buffer). Step k's (k = 0 first) noise
        is ``step_noises[k]`` or a draw from ``rng`` folded with k. DiT samples with
        ``clip_denoised=False``."""
        one_of("method", method, ("ddpm", "ddim"))
        if step_noises is None and rng is None:
            raise ValueError("sample_loop: give rng= or step_noises=")
        indices = jnp.arange(self.num_timesteps - 1, -1, -1)

        def body(x, k_i):
            k, i = k_i
            if step_noises is not None:
                z = step_noises[k]
            else:
                assert rng is not None  # one of the two was given (checked above)
                z = jax.random.normal(jax.random.fold_in(rng, k), x.shape)
            t = jnp.full((x.shape[0],), i, jnp.int32)
            if method == "ddpm":
                x_next, _ = self.p_sample(model, x, t, z, clip_denoised)
            else:
                x_next, _ = self.ddim_sample(model, x, t, z, clip_denoised, eta)
            return x_next, (x_next if trajectory else None)

        last, states = jax.lax.scan(body, noise, (jnp.arange(self.num_timesteps), indices))
        return states if trajectory else last  # pyright: ignore[reportReturnType]  (states is None only without trajectory)
