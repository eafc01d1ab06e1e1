"""Post-hoc EMA: power-function EMA profiles and their least-squares reconstruction.

Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion Models"
(EDM2, arXiv:2312.02696), Sec. 3 and App. C. Equation numbers below are the paper's (App. C,
arXiv v2), the same ones its reference implementation (NVlabs/edm2 ``training/phema.py``) cites.

**Power-function EMA.** At training time t the average weighs the past parameters θ(τ) by

    p_γ(τ; t) = (γ + 1) τ^γ / t^(γ+1),   0 ≤ τ ≤ t                                  (Eq. 121)

so a fixed fraction of the run (say its last 10 %) always carries the same weight, however long
the run. Its width relative to t, the standard deviation of τ/t under p_γ,

    std_rel = √( (γ + 1) / ((γ + 2)² (γ + 3)) )                                      (Eq. 123)

parameterises the profile; the inverse takes γ as the largest real root of

    γ³ + 7γ² + (16 − std_rel⁻²) γ + (12 − std_rel⁻²) = 0                  (Eq. 126, Algorithm 2)

(the same as (γ+2)²(γ+3) = std_rel⁻² (γ+1), Eq. 123 cleared of its fraction). Tracked during training
by the ordinary EMA recursion θ̂(t) = β θ̂(t − Δt) + (1 − β) θ(t) with

    β_γ(t) = (1 − Δt / t)^(γ+1)                                                    (Eq. 127)

(Δt = 1 when t counts optimizer updates). β_γ(Δt) = 0, so the first update overwrites whatever
the average held: a power EMA needs no debiasing. After n updates the weight on θ_k is exactly
(1 − ((k−1)/k)^(γ+1)) (k/n)^(γ+1) (the βs telescope), the discrete form of Eq. 121 (Eq. 108).

**Reconstruction (Algorithm 3).** Snapshots θ̂_i of profiles (t_i, γ_i) are kept during training.
The profile of any (t_r, γ_r) is approximated by the combination Σ_i x_i p_i closest to p_r in
L²: the normal equations A x = b with A_ij = ⟨p_i, p_j⟩, b_i = ⟨p_i, p_r⟩, where

    ⟨p_a, p_b⟩ = (γ_a + 1)(γ_b + 1) / ((γ_a + γ_b + 1) max(t_a, t_b)) · (t_a / t_b)^e,
    e = γ_b if t_a < t_b else −γ_a                                                  (Eq. 151)

x is normalised to sum to one, and θ̂_r = Σ_i x_i θ̂_i. The host-side math is NumPy float64;
``power_beta`` is traceable and runs inside the jitted step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Params = Any

#: std_rel of the uniform average over the whole run (γ = 0): the widest profile accepted here.
MAX_STD_REL = float(np.sqrt(1.0 / 12.0))


def _check_std_rel(std_rel: np.ndarray | float, what: str = "std_rel") -> np.ndarray:
    std_rel = np.asarray(std_rel, np.float64)
    bad = ~((std_rel > 0) & (std_rel < MAX_STD_REL))
    if np.any(bad):
        raise ValueError(
            f"{what}={std_rel[bad].ravel().tolist()} is invalid: expected values in "
            f"(0, {MAX_STD_REL:.6f}) (0 < std_rel < 1/√12, the uniform average; EDM2 uses 0.05-0.10)"
        )
    return std_rel


def gamma_to_std_rel(gamma: np.ndarray | float) -> np.ndarray:
    """std_rel of the power profile with exponent γ ≥ 0 (Eq. 123)."""
    gamma = np.asarray(gamma, np.float64)
    if np.any(gamma < 0):
        raise ValueError(f"gamma={gamma.ravel().tolist()} is invalid: expected exponents >= 0")
    return np.sqrt((gamma + 1) / ((gamma + 2) ** 2 * (gamma + 3)))


def std_rel_to_gamma(std_rel: np.ndarray | float) -> np.ndarray:
    """γ of the power profile of relative width std_rel: the largest real root of Eq. 126.

    f(γ) = (γ+2)²(γ+3) − s(γ+1), s = std_rel⁻², is convex for γ > −7/3 and positive at γ = √s
    (there (√s+2)²(√s+3) > s(√s+3) > s(√s+1)), so Newton's method started at √s decreases
    monotonically onto the largest root; a fixed 64 iterations reach float64 precision.
    """
    std_rel = _check_std_rel(std_rel)
    s = std_rel**-2
    gamma = np.sqrt(s)
    for _ in range(64):
        f = (gamma + 2) ** 2 * (gamma + 3) - s * (gamma + 1)
        df = 2 * (gamma + 2) * (gamma + 3) + (gamma + 2) ** 2 - s
        gamma = gamma - np.where(df > 0, f / np.where(df > 0, df, 1.0), 0.0)
    return gamma


def _log_beta(gamma: float | jax.Array, t: jax.Array | float, dt: float) -> jax.Array:
    t = jnp.maximum(jnp.asarray(t, jnp.float32), dt)
    return (jnp.asarray(gamma, jnp.float32) + 1.0) * jnp.log1p(-dt / t)


def power_beta(gamma: float | jax.Array, t: jax.Array | float, dt: float = 1.0) -> jax.Array:
    """β_γ(t) = (1 − Δt/t)^(γ+1) (Eq. 127): the EMA factor of the update that reaches time t.

    Traceable; ``t`` ≥ Δt (t = Δt gives β = 0: the first update replaces the average). Computed
    as exp((γ+1)·log1p(−Δt/t)): in float32, 1 − Δt/t itself would lose most digits of Δt/t once
    t reaches ~10⁵ updates.
    """
    return jnp.exp(_log_beta(gamma, t, dt))


def power_update(ema: Params, params: Params, gamma: float, t: jax.Array | int) -> Params:
    """One power-EMA update at update count ``t`` ≥ 1 (Eq. 127 with Δt = 1); pure, runs in jit.

    θ̂ ← β θ̂ + (1 − β) θ, with 1 − β = −expm1((γ+1)·log1p(−1/t)) so the small weight of the
    new parameters keeps its precision late in a long run.
    """
    log_beta = _log_beta(gamma, t, 1.0)
    beta, weight = jnp.exp(log_beta), -jnp.expm1(log_beta)
    return jax.tree.map(lambda e, p: (beta * e + weight * p).astype(e.dtype), ema, params)


def profile_weights(t: float, std_rel: float, length: int) -> np.ndarray:
    """The power profile ending at ``t`` sampled at τ = 0, 1, ..., length−1 and normalised to
    sum to one (Eq. 121 at integer times, the discrete form Eq. 108): the weight each training
    time carries in the average; zero after t."""
    gamma = std_rel_to_gamma(std_rel)
    tau = np.arange(length, dtype=np.float64)
    w = np.where(tau <= t, (gamma + 1) / t * (np.minimum(tau, t) / t) ** gamma, 0.0)
    return w / np.sum(w)


def profile_inner_product(
    t_a: np.ndarray | float, std_a: np.ndarray | float, t_b: np.ndarray | float, std_b: np.ndarray | float
) -> np.ndarray:
    """⟨p_a, p_b⟩ = ∫ p_a(τ) p_b(τ) dτ of two power profiles (Eq. 151); broadcasts."""
    t_a, t_b = np.asarray(t_a, np.float64), np.asarray(t_b, np.float64)
    g_a, g_b = std_rel_to_gamma(std_a), std_rel_to_gamma(std_b)
    exponent = np.where(t_a < t_b, g_b, -g_a)
    return (g_a + 1) * (g_b + 1) * (t_a / t_b) ** exponent / ((g_a + g_b + 1) * np.maximum(t_a, t_b))


def solve_coefficients(
    t_in: Sequence[float],
    std_in: Sequence[float],
    t_out: float | Sequence[float],
    std_out: float | Sequence[float],
) -> np.ndarray:
    """Least-squares weights [len(in), len(out)] that turn snapshots of profiles (t_in,
    std_in) into the profiles (t_out, std_out) (Algorithm 3): solve A x = b with Gram matrix
    A_ij = ⟨p_i, p_j⟩ and b_ij = ⟨p_i, p_out_j⟩ (Eq. 151), then scale each column to sum to one.
    """
    ti, si = np.broadcast_arrays(np.asarray(t_in, np.float64), np.asarray(std_in, np.float64))
    to, so = np.broadcast_arrays(np.asarray(t_out, np.float64), np.asarray(std_out, np.float64))
    ti, si, to, so = (np.ravel(a) for a in (ti, si, to, so))
    if ti.size == 0:
        raise ValueError("solve_coefficients: no snapshots to reconstruct from")
    if np.any(ti <= 0) or np.any(to <= 0):
        raise ValueError(
            f"solve_coefficients: times must be > 0, got t_in={ti.tolist()}, t_out={to.tolist()}"
        )
    col, row = (lambda a: a[:, None]), (lambda a: a[None, :])
    gram = profile_inner_product(col(ti), col(si), row(ti), row(si))
    rhs = profile_inner_product(col(ti), col(si), row(to), row(so))
    x = np.linalg.solve(gram, rhs)
    return x / np.sum(x, axis=0, keepdims=True)


class Snapshot(NamedTuple):
    """A stored power EMA: its update count ``t`` (> 0), its ``std_rel`` and its ``params``."""

    t: int
    std_rel: float
    params: Params


def reconstruct(snapshots: Sequence[Snapshot], std_rel: float, t: int | None = None) -> Params:
    """The power EMA of relative width ``std_rel`` at update ``t`` (default: the latest snapshot),
    as the least-squares combination (Algorithm 3) of ``snapshots`` taken at or before ``t``.

    Leaves are combined on the host in float64 and returned as NumPy arrays of each leaf's dtype.
    """
    _check_std_rel(np.asarray(std_rel), "std_rel")
    if not snapshots:
        raise ValueError("reconstruct: no snapshots given")
    t = max(s.t for s in snapshots) if t is None else t
    if not any(s.t == t for s in snapshots):
        times = sorted({s.t for s in snapshots})
        raise ValueError(f"reconstruct: t={t} is not the time of a snapshot; snapshot times are {times}")
    used = [s for s in snapshots if 0 < s.t <= t]
    weights = solve_coefficients([s.t for s in used], [s.std_rel for s in used], t, std_rel)[:, 0]
    leaves = [jax.tree.leaves(s.params) for s in used]
    treedef = jax.tree.structure(used[0].params)
    out = []
    for j, first in enumerate(leaves[0]):
        acc = np.zeros(np.shape(first), np.float64)
        for w, ls in zip(weights, leaves, strict=True):
            acc += w * np.asarray(ls[j], np.float64)
        out.append(acc.astype(np.asarray(first).dtype))
    return jax.tree.unflatten(treedef, out)


def std_rel_key(std_rel: float) -> str:
    """A stable name for a profile (``"0.050"`` style, three decimals, as EDM2 names its files)."""
    return f"{float(std_rel):.3f}"


def parse_std_rels(values: Sequence[float] | Mapping[str, Any], what: str) -> tuple[float, ...]:
    """Validate a list of profile widths: each in (0, 1/√12), distinct at three decimals."""
    values = tuple(float(v) for v in values)
    _check_std_rel(np.asarray(values, np.float64), what)
    keys = [std_rel_key(v) for v in values]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{what}={list(values)} is invalid: expected distinct widths (to 3 decimals)")
    return values


__all__ = [
    "MAX_STD_REL",
    "Snapshot",
    "gamma_to_std_rel",
    "parse_std_rels",
    "power_beta",
    "power_update",
    "profile_inner_product",
    "profile_weights",
    "reconstruct",
    "solve_coefficients",
    "std_rel_key",
    "std_rel_to_gamma",
]
