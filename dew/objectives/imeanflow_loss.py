"""Improved MeanFlow's loss as a pure function of a network function and explicit random draws.

iMF (Lu et al. 2025, "Improved Mean Flows: On the Challenges of Fastforward Generative Models";
reference: Lyy-iiis/imeanflow ``imf.py``) changes MeanFlow in three places:

* the target: the loss is a v-loss on the compound V = u_θ + (t − r) sg(du_θ/dt), regressed on
  the guided velocity v_g (not u_θ on v − (t − r) du/dt), and the JVP's z-tangent is the
  network's own predicted conditional velocity v_θ(z_t, t | c, ω') (not the sampled v);
* the network: it has an auxiliary v-head (``imf_fn`` returns (u, v)), trained by a second
  adaptively weighted loss ‖v_θ − v_g‖², and it is conditioned on the guidance scale ω and the
  guidance interval [t_min, t_max] (so one model samples at any scale and interval);
* guidance: ω is drawn per example (``sample_cfg_scale``: log-uniform on [1, 1 + s_max] for
  β = 1, a power law otherwise), [t_min, t_max] uniformly from [0, 0.5) × [0.5, 1) (the whole
  [0, 1] on flow-matching rows), and v_g = v + (1 − 1/ω')(v_θ(c) − v_θ(∅)), ω' = ω inside the
  interval and 1 outside (flow-matching rows: ω everywhere).

(t, r) are drawn as MeanFlow draws them (logit-normal only; ``TimeSampling``), class dropout is
MeanFlow's rule, and the weighting is MeanFlow's adaptive weight, applied to each loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from dew.objectives.meanflow_loss import TimeSampling, Weighting, dropped_rows, per_row

IMFFn = Callable[..., tuple[jax.Array, jax.Array]]
"""(z, t, h, omega, t_min, t_max, y) -> (u, v), every time-like input [B]."""

S_MAX = 7.0  # imf.py's sample_cfg_scale default: ω in [1, 1 + s_max]


@dataclasses.dataclass(frozen=True)
class IMFGuidance:
    """iMF's training-time guidance draws: ``cfg_beta`` shapes ω's law on [1, 1 + ``s_max``]
    (1: log-uniform), ``class_dropout_prob`` MeanFlow's dropout rule."""

    cfg_beta: float = 1.0
    class_dropout_prob: float = 0.1
    s_max: float = S_MAX

    def __post_init__(self) -> None:
        if not 0.0 <= self.class_dropout_prob <= 1.0:
            raise ValueError(
                f"class_dropout_prob={self.class_dropout_prob!r} is invalid: expected a float in [0, 1]"
            )
        if not self.s_max > 0:
            raise ValueError(f"s_max={self.s_max!r} is invalid: expected a float > 0")

    def scale(self, u: jax.Array) -> jax.Array:
        """ω from a uniform draw u, as ``sample_cfg_scale``: exp(u log(1 + s_max)) for β = 1,
        else exp(log1p(u expm1((1 − β) log1p(s_max))) / (1 − β))."""
        smax = jnp.asarray(self.s_max, jnp.float32)
        if self.cfg_beta == 1.0:
            return jnp.exp(u * jnp.log1p(smax))
        b = jnp.asarray(self.cfg_beta, jnp.float32)
        log_base = (1.0 - b) * jnp.log1p(smax)
        return jnp.exp(jnp.log1p(u * jnp.expm1(log_base)) / (1.0 - b))


@dataclasses.dataclass(frozen=True)
class IMFDraws:
    """One batch's random draws: raw t and r [B] (N(0, 1)), the noise e, t_min ~ U[0, 0.5) and
    t_max ~ U[0.5, 1) [B], the uniform behind ω [B], the class-dropout uniforms [B]."""

    t_raw: jax.Array
    r_raw: jax.Array
    noise: jax.Array
    t_min: jax.Array
    t_max: jax.Array
    omega_uniform: jax.Array
    drop_uniform: jax.Array


_DRAW_FIELDS = ["t_raw", "r_raw", "noise", "t_min", "t_max", "omega_uniform", "drop_uniform"]
jax.tree_util.register_dataclass(IMFDraws, data_fields=_DRAW_FIELDS, meta_fields=[])


def draw_imf(rng: jax.Array, x: jax.Array) -> IMFDraws:
    """Fresh draws for a batch ``x`` [B, ...], with the reference's laws."""
    k = jax.random.split(rng, 7)
    b = x.shape[0]
    return IMFDraws(
        jax.random.normal(k[0], (b,)),
        jax.random.normal(k[1], (b,)),
        jax.random.normal(k[2], x.shape, x.dtype),
        jax.random.uniform(k[3], (b,), minval=0.0, maxval=0.5),
        jax.random.uniform(k[4], (b,), minval=0.5, maxval=1.0),
        jax.random.uniform(k[5], (b,)),
        jax.random.uniform(k[6], (b,)),
    )


@dataclasses.dataclass(frozen=True)
class IMFTerms:
    """What the iMF loss computed."""

    loss: jax.Array  # scalar: mean over the batch of the two weighted losses' sum
    loss_u: jax.Array  # mean (V − v_g)², monitoring
    loss_v: jax.Array  # mean (v − v_g)², monitoring
    weight_u: jax.Array  # [B] (‖V − v_g‖² + ε)^p
    weight_v: jax.Array  # [B] (‖v − v_g‖² + ε)^p
    du_dt: jax.Array
    v_g: jax.Array


jax.tree_util.register_dataclass(
    IMFTerms, data_fields=[f.name for f in dataclasses.fields(IMFTerms)], meta_fields=[]
)


def imf_loss(
    imf_fn: IMFFn,
    x: jax.Array,
    y: jax.Array,
    draws: IMFDraws,
    times: TimeSampling,
    guidance: IMFGuidance,
    weighting: Weighting,
    null_label: int,
) -> IMFTerms:
    """iMF's ``forward``: the loss of ``imf_fn`` on data ``x`` [B, ...] with labels ``y`` [B].

    z_t = (1 − t) x + t e,  v = e − x,  ω ~ p(ω),  [t_min, t_max] ~ U (fm rows: [0, 1])
    v_c, v_u = v_θ(z_t, t | y, ω), v_θ(z_t, t | ∅, 1)     (h = 0, interval [0, 1])
    ω' = ω on t ∈ [t_min, t_max] else 1;  v_c' = v_θ(z_t, t | y, ω')
    v_g = v + (1 − 1/ω')(v_c' − v_u)  (fm rows: ω);  (y, v_g) ← class dropout
    (u, du/dt, v_θ) = jvp(u(·, ·, t − r | ω, t_min, t_max, y), (z_t, t, r), (v_c', 1, 0))
    V = u + (t − r) sg(du/dt);  L = mean_B [w(‖V − sg v_g‖²) + w(‖v_θ − sg v_g‖²)]
    """
    b = x.shape[0]
    t, r = times.times(draws.t_raw, draws.r_raw)
    fm = times.flow_matching_rows(b)
    e = draws.noise
    z_t = (1 - per_row(t, x)) * x + per_row(t, x) * e
    v_t = e - x
    t_min = jnp.where(fm, 0.0, draws.t_min)
    t_max = jnp.where(fm, 1.0, draws.t_max)
    omega = guidance.scale(draws.omega_uniform)

    def v_cond(z, t_, w, labels):
        return imf_fn(z, t_, jnp.zeros_like(t_), w, jnp.zeros_like(t_), jnp.ones_like(t_), labels)[1]

    # imf.py's v_fn: the conditional (ω) and unconditional (1) branches as one doubled batch.
    both = v_cond(
        jnp.concatenate([z_t, z_t]),
        jnp.concatenate([t, t]),
        jnp.concatenate([omega, jnp.ones_like(omega)]),
        jnp.concatenate([y, jnp.full_like(y, null_label)]),
    )
    v_c, v_u = jnp.split(both, 2)
    v_g_fm = v_t + per_row(1 - 1 / omega, v_t) * (v_c - v_u)
    w_in = jnp.where((t >= t_min) & (t <= t_max), omega, 1.0)
    v_c = v_cond(z_t, t, w_in, y)
    v_g = v_t + per_row(1 - 1 / w_in, v_t) * (v_c - v_u)
    v_g = jnp.where(per_row(fm, v_g), v_g_fm, v_g)

    drop = dropped_rows(draws.drop_uniform, guidance.class_dropout_prob)
    labels = jnp.where(drop, null_label, y)
    v_g = jnp.where(per_row(drop, v_g), v_t, v_g)

    def u_of(z, t_, r_):
        return imf_fn(z, t_, t_ - r_, omega, t_min, t_max, labels)

    u, du_dt, v = jax.jvp(u_of, (z_t, t, r), (v_c, jnp.ones_like(t), jnp.zeros_like(r)), has_aux=True)
    du_dt = jax.lax.stop_gradient(du_dt)
    compound = u + per_row(t - r, u) * du_dt
    v_g = jax.lax.stop_gradient(v_g)
    axes = tuple(range(1, x.ndim))
    loss_u, weight_u = weighting(jnp.sum((compound - v_g) ** 2, axis=axes))
    loss_v, weight_v = weighting(jnp.sum((v - v_g) ** 2, axis=axes))
    return IMFTerms(
        jnp.mean(loss_u + loss_v),
        jnp.mean((compound - v_g) ** 2),
        jnp.mean((v - v_g) ** 2),
        weight_u,
        weight_v,
        du_dt,
        v_g,
    )
