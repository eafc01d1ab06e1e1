"""The MeanFlow losses as pure functions of a network function and explicit random draws.

MeanFlow (Geng et al. 2025, "Mean Flows for One-step Generative Modeling") learns the average
velocity u(z_t, r, t) = 1/(t − r) ∫_r^t v(z_τ, τ) dτ on the linear path z_t = (1 − t) x + t e
(x data, e ~ N(0, I), v = e − x). Differentiating (t − r) u = ∫_r^t v dτ in t gives the MeanFlow
identity

    u(z_t, r, t) = v(z_t, t) − (t − r) d/dt u(z_t, r, t),
    d/dt u = v ∂_z u + ∂_t u          (the JVP of u with tangents (v, 1, 0) in (z, t, r)),

and the loss regresses u_θ on sg(v − (t − r) d/dt u_θ), weighted adaptively by
1 / sg(‖Δ‖² + ε)^p. Improved MeanFlow (Lu et al. 2025, "Improved Mean Flows") instead
regresses the compound V = u_θ + (t − r) sg(d/dt u_θ) on the guided velocity, with the JVP
tangent the network's own predicted conditional velocity and an auxiliary v-head loss.

Everything here follows the references' JAX code (Gsunshine/meanflow ``meanflow.py`` and
Lyy-iiis/imeanflow ``imf.py``) line for line, with their random draws passed in (``MeanFlowDraws``,
``IMFDraws``) so the same draws give the same numbers; ``draw_*`` make them as the references do.
Networks are functions: ``u_fn(z, t, h, y) -> u`` for MeanFlow (t, h = t − r of shape [B]) and
``imf_fn(z, t, h, omega, t_min, t_max, y) -> (u, v)`` for iMF. ``null_label`` is the label the
network reads as "no class" (the references' ``num_classes``; dew's class encoder's -1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

UFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class TimeSampling:
    """How (t, r) are drawn: ``noise_dist`` "logit_normal" (sigmoid(N(P_mean, P_std²))) or
    "uniform" (U[0, 1)), two independent draws sorted so t >= r, and the first
    ``int(B * data_proportion)`` rows of the batch with r = t (plain flow matching)."""

    noise_dist: str = "logit_normal"
    P_mean: float = -0.4
    P_std: float = 1.0
    data_proportion: float = 0.75

    def __post_init__(self) -> None:
        if self.noise_dist not in ("logit_normal", "uniform"):
            raise ValueError(
                f"noise_dist={self.noise_dist!r} is invalid: expected 'logit_normal' or 'uniform'"
            )
        if not 0.0 <= self.data_proportion <= 1.0:
            raise ValueError(
                f"data_proportion={self.data_proportion!r} is invalid: expected a float in [0, 1]"
            )

    def raw(self, rng: jax.Array, batch: int) -> jax.Array:
        """One raw draw [B]: N(0, 1) for logit-normal, U[0, 1) for uniform."""
        if self.noise_dist == "logit_normal":
            return jax.random.normal(rng, (batch,), jnp.float32)
        return jax.random.uniform(rng, (batch,), jnp.float32)

    def times(self, t_raw: jax.Array, r_raw: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(t, r) [B] from two raw draws, as the references' ``sample_tr``."""
        if self.noise_dist == "logit_normal":
            t_raw = jax.nn.sigmoid(t_raw * self.P_std + self.P_mean)
            r_raw = jax.nn.sigmoid(r_raw * self.P_std + self.P_mean)
        t, r = jnp.maximum(t_raw, r_raw), jnp.minimum(t_raw, r_raw)
        return t, jnp.where(self.flow_matching_rows(t.shape[0]), t, r)

    def flow_matching_rows(self, batch: int) -> jax.Array:
        """[B] bool: the rows with r = t (the first ``int(B * data_proportion)``)."""
        return jnp.arange(batch) < int(batch * self.data_proportion)


@dataclasses.dataclass(frozen=True)
class Guidance:
    """MeanFlow's guidance folded into training (the paper's CFG section; ``guidance_fn`` in the code).

    ``guidance_eq`` "cfg" replaces v by v_g = ω v + (1 − ω − κ) v_θ(∅) + κ v_θ(c) inside
    ``[t_start, t_end]`` (ω = 1, κ = 0 outside), v_θ the network's own instantaneous velocity
    u_θ(z_t, t, h=0); κ = 0 needs only the unconditional branch: v_g = v_θ(∅) + ω (v − v_θ(∅)).
    "none" trains on v. ``class_dropout_prob``: the first ``#{u_i < p}`` rows of the batch
    (a count drawn per batch) get the null label and the unguided v, as the reference's
    ``cond_drop``."""

    guidance_eq: str = "cfg"
    omega: float = 1.0
    kappa: float = 0.5
    class_dropout_prob: float = 0.1
    t_start: float = 0.0
    t_end: float = 1.0

    def __post_init__(self) -> None:
        if self.guidance_eq not in ("cfg", "none"):
            raise ValueError(f"guidance_eq={self.guidance_eq!r} is invalid: expected 'cfg' or 'none'")
        if not 0.0 <= self.class_dropout_prob <= 1.0:
            raise ValueError(
                f"class_dropout_prob={self.class_dropout_prob!r} is invalid: expected a float in [0, 1]"
            )
        if not 0.0 <= self.t_start <= self.t_end <= 1.0:
            raise ValueError(
                f"(t_start, t_end)=({self.t_start}, {self.t_end}) is invalid: "
                "expected 0 <= t_start <= t_end <= 1"
            )

    @property
    def uses_classes(self) -> bool:
        """Whether the settings need class labels (guidance, or labels dropped for it)."""
        return self.guidance_eq == "cfg" or self.class_dropout_prob > 0


@dataclasses.dataclass(frozen=True)
class Weighting:
    """Adaptive loss weight: L = ‖Δ‖² / sg((‖Δ‖² + norm_eps)^norm_p) per example."""

    norm_p: float = 1.0
    norm_eps: float = 0.01

    def __call__(self, per_example: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(weighted per-example loss, the weight's denominator (‖Δ‖² + ε)^p)."""
        denominator = (per_example + self.norm_eps) ** self.norm_p
        return per_example / jax.lax.stop_gradient(denominator), denominator


@dataclasses.dataclass(frozen=True)
class MeanFlowDraws:
    """One batch's random draws: raw t and r [B] (``TimeSampling.raw``), the noise e (the
    sample's shape) and the class-dropout uniforms [B]."""

    t_raw: jax.Array
    r_raw: jax.Array
    noise: jax.Array
    drop_uniform: jax.Array


jax.tree_util.register_dataclass(
    MeanFlowDraws, data_fields=["t_raw", "r_raw", "noise", "drop_uniform"], meta_fields=[]
)


def draw_meanflow(rng: jax.Array, x: jax.Array, times: TimeSampling) -> MeanFlowDraws:
    """Fresh draws for a batch ``x`` [B, ...]."""
    k_t, k_r, k_e, k_d = jax.random.split(rng, 4)
    b = x.shape[0]
    return MeanFlowDraws(
        times.raw(k_t, b),
        times.raw(k_r, b),
        jax.random.normal(k_e, x.shape, x.dtype),
        jax.random.uniform(k_d, (b,)),
    )


def per_row(a: jax.Array, like: jax.Array) -> jax.Array:
    """[B] -> [B, 1, ...] broadcastable against ``like``."""
    return a.reshape((-1,) + (1,) * (like.ndim - 1))


def dropped_rows(drop_uniform: jax.Array, probability: float) -> jax.Array:
    """[B] bool: the reference's ``cond_drop`` rule, the first #{u_i < p} rows."""
    count = jnp.sum(drop_uniform < probability).astype(jnp.int32)
    return jnp.arange(drop_uniform.shape[0]) < count


def guided_velocity(
    u_fn: UFn, v: jax.Array, z_t: jax.Array, t: jax.Array, y: jax.Array, g: Guidance, null_label: int
) -> jax.Array:
    """v_g, the reference's ``guidance_fn`` (the network's velocities under stop-gradient)."""
    if g.guidance_eq != "cfg":
        return v
    h0 = jnp.zeros_like(t)
    inside = (t >= g.t_start) & (t <= g.t_end)
    v_uncond = u_fn(z_t, t, h0, jnp.full_like(y, null_label))
    omega = per_row(jnp.where(inside, g.omega, 1.0), v)
    if g.kappa == 0:
        v_g = v_uncond + omega * (v - v_uncond)
    else:
        v_cond = u_fn(z_t, t, h0, y)
        kappa = per_row(jnp.where(inside, g.kappa, 0.0), v)
        v_g = omega * v + (1 - omega - kappa) * v_uncond + kappa * v_cond
    return jax.lax.stop_gradient(v_g)


@dataclasses.dataclass(frozen=True)
class MeanFlowTerms:
    """What a MeanFlow loss computed, per example where it has a batch axis."""

    loss: jax.Array  # scalar: the mean weighted loss
    per_example: jax.Array  # ‖u − u_tgt‖² [B]
    weight_denominator: jax.Array  # (‖u − u_tgt‖² + ε)^p [B]
    u_tgt: jax.Array
    v_loss: jax.Array  # ‖u − v‖² [B], monitoring only
    t: jax.Array
    r: jax.Array


jax.tree_util.register_dataclass(
    MeanFlowTerms,
    data_fields=["loss", "per_example", "weight_denominator", "u_tgt", "v_loss", "t", "r"],
    meta_fields=[],
)


def meanflow_loss(
    u_fn: UFn,
    x: jax.Array,
    y: jax.Array,
    draws: MeanFlowDraws,
    times: TimeSampling,
    guidance: Guidance,
    weighting: Weighting,
    null_label: int,
    guide_fn: UFn | None = None,
) -> MeanFlowTerms:
    """MeanFlow's ``forward``: the loss of ``u_fn`` on data ``x`` [B, ...] with labels ``y`` [B].

    z_t = (1 − t) x + t e,  v = e − x,  v_g = guided(v),  (y, v_g) ← class dropout
    (u, du/dt) = jvp(λ z, t, r: u(z, t, t − r, y), (z_t, t, r), (v_g, 1, 0))
    u_tgt = sg(v_g − clip(t − r, 0, 1) du/dt),  L = mean_B ‖u − u_tgt‖² / sg((‖·‖² + ε)^p)
    """
    t, r = times.times(draws.t_raw, draws.r_raw)
    e = draws.noise
    z_t = (1 - per_row(t, x)) * x + per_row(t, x) * e
    v = e - x
    v_g = guided_velocity(guide_fn or u_fn, v, z_t, t, y, guidance, null_label)
    drop = dropped_rows(draws.drop_uniform, guidance.class_dropout_prob)
    y_in = jnp.where(drop, null_label, y)
    v_g = jnp.where(per_row(drop, v), v, v_g)

    def u_of(z, t_, r_):
        return u_fn(z, t_, t_ - r_, y_in)

    u, du_dt = jax.jvp(u_of, (z_t, t, r), (v_g, jnp.ones_like(t), jnp.zeros_like(r)))
    u_tgt = jax.lax.stop_gradient(v_g - per_row(jnp.clip(t - r, 0.0, 1.0), u) * du_dt)
    per_example = jnp.sum((u - u_tgt) ** 2, axis=tuple(range(1, x.ndim)))
    weighted, denominator = weighting(per_example)
    v_loss = jnp.sum((u - v) ** 2, axis=tuple(range(1, x.ndim)))
    return MeanFlowTerms(jnp.mean(weighted), per_example, denominator, u_tgt, v_loss, t, r)
