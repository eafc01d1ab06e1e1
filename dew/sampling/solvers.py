"""Samplers of the probability-flow ODE dx/dσ = (x − D(x; σ)) / σ (EDM Eq. 3 with σ(t) = t,
s(t) = 1) and of its stochastic variant (EDM Algorithm 2).

The contract of ``sample``: ``sigmas`` are the points from T down to the last point; a solver
step crosses each interval, then the model's clean prediction D(x; σ_last) is returned. That
final prediction is what an Euler step from σ_last to σ = 0 computes, so the schedule other
implementations pass (k-diffusion's, with a trailing 0) is accepted too: a trailing 0 makes the
last interval the clean prediction at the point before it, for every solver (what k-diffusion's
samplers compute on that interval), and the denoiser is never evaluated at σ = 0. A schedule
that is known when ``sample`` is called (not traced) is checked: finite, strictly decreasing,
positive but for a trailing 0; a traced one cannot be checked, and a trailing 0 in it is handled
inside the program (that interval's step is computed and discarded: one wasted NFE).

The loop is one ``lax.scan``, so the whole trajectory compiles into one program; with a
``callback`` it is a Python loop over one jitted step instead, so the callback sees each step's
(x, denoised, σ) as it happens.

A solver is a small frozen object: ``init`` builds the state it carries between steps (the
previous prediction of a multistep method), ``step`` crosses one interval and also returns the
prediction it made at the interval's start, ``finish`` produces the output at the last point.
Stochastic solvers get fresh normal noise for each step from ``step_noise(rng, i, shape)``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew import registry

Denoiser = Callable[[jax.Array, jax.Array], jax.Array]
"""D(x, σ): noisy batch and a scalar noise level -> the clean-sample estimate."""

State = Any

Callback = Callable[[jax.Array, jax.Array, jax.Array], None]
"""(x, denoised, σ): the state at a point, the model's clean prediction there, the point."""


def _slope(denoise: Denoiser, x: jax.Array, sigma: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(D(x; σ), d) with d = (x − D(x; σ)) / σ, the ODE's dx/dσ (EDM Alg. 1 line 4)."""
    denoised = denoise(x, sigma)
    return denoised, (x - denoised) / sigma


def step_noise(
    rng: jax.Array, index: jax.Array | int, shape: tuple[int, ...], dtype=jnp.float32
) -> jax.Array:
    """The standard normal noise a stochastic solver draws at step ``index`` (folded into rng)."""
    return jax.random.normal(jax.random.fold_in(rng, index), shape, dtype)


@dataclasses.dataclass(frozen=True)
class Solver:
    """One step rule; subclasses say how an interval is crossed. NFE per interval is ``nfe``."""

    nfe = 1
    stochastic = False

    def init(self, x: jax.Array) -> State:
        return ()

    def __call__(
        self, model: Denoiser, noise: jax.Array, schedule: jax.Array, rng: jax.Array | None = None
    ) -> jax.Array:
        """The ``Sampler`` interface (``dew.sampling.interface``): ``sample(model, noise,
        schedule, self, rng=rng)``, ``schedule`` being the σ points."""
        return sample(model, noise, schedule, self, rng=rng)

    def step(
        self,
        denoise: Denoiser,
        x: jax.Array,
        state: State,
        sigma: jax.Array,
        sigma_next: jax.Array,
        noise: jax.Array | None,
        num_steps: int | jax.Array,
    ) -> tuple[jax.Array, State, jax.Array]:
        """(x at σ', the new state, the clean prediction made at the interval's start)."""
        raise NotImplementedError

    def finish(
        self,
        denoise: Denoiser,
        x: jax.Array,
        state: State,
        sigma: jax.Array,
        noise: jax.Array | None,
        num_steps: int | jax.Array,
    ) -> jax.Array:
        return denoise(x, sigma)


@dataclasses.dataclass(frozen=True)
class Euler(Solver):
    """First order: x' = x + (σ' − σ) d."""

    def step(self, denoise, x, state, sigma, sigma_next, noise, num_steps):
        denoised, d = _slope(denoise, x, sigma)
        return x + (sigma_next - sigma) * d, state, denoised


@dataclasses.dataclass(frozen=True)
class Heun(Solver):
    """EDM Algorithm 1, lines 5-8: an Euler step, then the trapezoidal correction at σ'.

    σ' is never 0 here (the contract stops at the last point), so the correction always applies.
    """

    nfe = 2

    def step(self, denoise, x, state, sigma, sigma_next, noise, num_steps):
        denoised, d = _slope(denoise, x, sigma)
        x_euler = x + (sigma_next - sigma) * d
        _, d_next = _slope(denoise, x_euler, sigma_next)
        return x + (sigma_next - sigma) * 0.5 * (d + d_next), state, denoised


@dataclasses.dataclass(frozen=True)
class EDMStochastic(Solver):
    """EDM Algorithm 2: before each step, add noise to raise σ to σ̂ = (1 + γ) σ, then take a Heun
    step (or an Euler step, ``second_order=False``) from σ̂ to σ'.

    γ = min(S_churn / N, √2 − 1) while σ ∈ [S_tmin, S_tmax], else 0, where N counts every step down
    to σ = 0 (``len(sigmas)`` here, the final prediction included); the added noise is
    S_noise · ε · √(σ̂² − σ²). The defaults are the paper's ImageNet-64 settings.
    """

    s_churn: float = 40.0
    s_tmin: float = 0.05
    s_tmax: float = 50.0
    s_noise: float = 1.003
    second_order: bool = True
    stochastic = True

    def __post_init__(self) -> None:
        if self.s_churn < 0 or self.s_noise < 0:
            raise ValueError(
                f"EDMStochastic: s_churn and s_noise must be >= 0, got {self.s_churn}, {self.s_noise}"
            )
        if not self.s_tmin <= self.s_tmax:
            raise ValueError(f"EDMStochastic: s_tmin ({self.s_tmin}) must be <= s_tmax ({self.s_tmax})")

    @property
    def nfe(self) -> int:  # type: ignore[override]
        return 2 if self.second_order else 1

    def _churn(self, x, sigma, noise, num_steps):
        gamma_max = jnp.minimum(self.s_churn / num_steps, math.sqrt(2.0) - 1.0)
        inside = (sigma >= self.s_tmin) & (sigma <= self.s_tmax)
        gamma = jnp.where(inside, gamma_max, 0.0).astype(x.dtype)
        sigma_hat = sigma * (1 + gamma)
        # √(σ̂² − σ²) written as σ √(γ (2 + γ)): exactly 0 outside the churn range, never √(−ε).
        x_hat = x + self.s_noise * noise * (sigma * jnp.sqrt(gamma * (2 + gamma)))
        return x_hat, sigma_hat

    def step(self, denoise, x, state, sigma, sigma_next, noise, num_steps):
        x_hat, sigma_hat = self._churn(x, sigma, noise, num_steps)
        denoised, d = _slope(denoise, x_hat, sigma_hat)
        x_euler = x_hat + (sigma_next - sigma_hat) * d
        if not self.second_order:
            return x_euler, state, denoised
        _, d_next = _slope(denoise, x_euler, sigma_next)
        return x_hat + (sigma_next - sigma_hat) * 0.5 * (d + d_next), state, denoised

    def finish(self, denoise, x, state, sigma, noise, num_steps):
        # Alg. 2's last step goes to σ = 0, where Euler from σ̂ lands on D(x̂; σ̂).
        x_hat, sigma_hat = self._churn(x, sigma, noise, num_steps)
        return denoise(x_hat, sigma_hat)


@dataclasses.dataclass(frozen=True)
class DPMSolverPP2M(Solver):
    """DPM-Solver++(2M) (Lu et al. 2022, Algorithm 2) in the σ frame, with λ = −ln σ.

    With h = λ' − λ, x' = (σ'/σ) x − (e^{−h} − 1) D̃, where D̃ is the current prediction on the
    first step and, after it, the second-order multistep combination
    D̃ = (1 + 1/(2r)) D_i − 1/(2r) D_{i−1}, r = h_{i−1} / h_i. One model evaluation per step.
    """

    def init(self, x):
        return (jnp.zeros_like(x), jnp.zeros((), x.dtype), jnp.zeros((), bool))

    def step(self, denoise, x, state, sigma, sigma_next, noise, num_steps):
        previous, h_last, has_previous = state
        denoised = denoise(x, sigma)
        h = jnp.log(sigma) - jnp.log(sigma_next)
        r = jnp.where(has_previous, h_last / h, 1.0)  # no 0/0 on the first step
        combined = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * previous
        estimate = jnp.where(has_previous, combined, denoised)
        x_next = (sigma_next / sigma) * x - jnp.expm1(-h) * estimate
        return x_next, (denoised, h.astype(x.dtype), jnp.ones((), bool)), denoised


SOLVERS: dict[str, Solver] = {
    "euler": Euler(),
    "heun": Heun(),
    "edm_stochastic": EDMStochastic(),
    "dpmpp_2m": DPMSolverPP2M(),
}
for _name, _solver in SOLVERS.items():
    registry.samplers.register(_name, _solver)


def _resolve(solver: str | Solver) -> Solver:
    if isinstance(solver, Solver):
        return solver
    found = registry.samplers[solver]
    if not isinstance(found, Solver):
        raise TypeError(f"sample: samplers[{solver!r}] is {found!r}, not a dew.sampling.solvers.Solver")
    return found


def nfe(solver: str | Solver, points: int) -> int:
    """Model evaluations ``sample`` makes for ``points`` σ points: one per interval per stage,
    plus the final prediction."""
    return _resolve(solver).nfe * (points - 1) + 1


def _concrete(x: Any) -> np.ndarray | None:
    """``x`` as a NumPy array when its values are known now, None when it is traced."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _check_sigmas(sigmas: np.ndarray) -> bool:
    """Raise on a schedule ``sample`` cannot follow; True when it ends in a 0 to drop."""
    if not np.all(np.isfinite(sigmas)):
        raise ValueError(f"sample: sigmas must be finite, got {sigmas.tolist()}")
    ends_in_zero = bool(sigmas[-1] == 0)
    positive = sigmas[:-1] if ends_in_zero else sigmas
    if positive.size == 0 or not np.all(positive > 0):
        raise ValueError(
            "sample: sigmas must be > 0 at every point but a trailing 0 (the clean prediction), "
            f"got {sigmas.tolist()}"
        )
    if not np.all(np.diff(sigmas) < 0):
        raise ValueError(
            f"sample: sigmas must decrease strictly from T to the last point, got {sigmas.tolist()}"
        )
    return ends_in_zero


UNIT_NOISE_TOLERANCE = 6.0
"""How many standard errors the starting noise's standard deviation may stray from 1."""


def check_unit_noise(noise: Any) -> None:
    """Raise unless ``noise`` (when its values are known) looks like standard normal noise.

    The sample standard deviation s of n i.i.d. N(0, 1) values has standard error ≈ 1/√(2n);
    ``noise`` is refused when |s − 1| exceeds ``UNIT_NOISE_TOLERANCE`` of those (a false refusal
    of real unit noise has probability ~1e-9). A start already scaled by σ_max (k-diffusion's
    convention, s ≈ 80) is refused at any size. Traced noise cannot be checked.
    """
    values = _concrete(noise)
    if values is None or values.size < 2:
        return
    std = float(np.std(values.astype(np.float64)))
    bound = UNIT_NOISE_TOLERANCE / math.sqrt(2 * values.size)
    if abs(std - 1.0) > bound:
        raise ValueError(
            f"sample: noise must be standard normal (sample multiplies it by sigmas[0] itself), got a "
            f"standard deviation of {std:.4g} over {values.size} values, expected 1 ± {bound:.3g}; "
            "pass the unscaled noise (e.g. noise / sigmas[0] for a start already scaled by σ_max)"
        )


def _run(denoise, noise, sigmas, solver, rng, keep_states: bool, callback: Callback | None = None):
    rule = _resolve(solver)
    if rule.stochastic and rng is None:
        raise ValueError(f"sample: solver {rule!r} is stochastic and needs rng=")
    check_unit_noise(noise)
    known = _concrete(sigmas)
    if known is not None:
        if known.ndim != 1 or known.shape[0] < 2:
            raise ValueError(f"sample: sigmas must be a 1-D array of >= 2 points, got shape {known.shape}")
        if _check_sigmas(known):
            known = known[:-1]  # the last interval is the clean prediction at the point before it
        sigmas, ends_in_zero = jnp.asarray(known, noise.dtype), None
        last = len(known) - 1  # index of the point the output is predicted at
    else:
        if sigmas.ndim != 1 or sigmas.shape[0] < 2:
            raise ValueError(f"sample: sigmas must be a 1-D array of >= 2 points, got shape {sigmas.shape}")
        sigmas = sigmas.astype(noise.dtype)
        ends_in_zero = sigmas[-1] == 0
        last = sigmas.shape[0] - 1 - ends_in_zero.astype(jnp.int32)
    # N of EDM Alg. 2: every step down to σ = 0, the final prediction included.
    num_steps = last + 1

    def noise_at(i: jax.Array | int) -> jax.Array | None:
        if not rule.stochastic:
            return None
        assert rng is not None  # a stochastic rule without rng raised above
        return step_noise(rng, i, noise.shape, noise.dtype)

    def body(carry, interval, report: bool = False):
        x, state = carry
        i, sigma, sigma_next = interval
        x_next, state_next, denoised = rule.step(denoise, x, state, sigma, sigma_next, noise_at(i), num_steps)
        if ends_in_zero is not None:  # traced schedule: the interval into 0 leaves x where it is
            moves = sigma_next > 0
            x_next = jnp.where(moves, x_next, x)
            state_next = jax.tree.map(lambda new, old: jnp.where(moves, new, old), state_next, state)
        return (x_next, state_next), (x if keep_states or report else None, denoised if report else None)

    x = noise * sigmas[0]
    steps = (jnp.arange(sigmas.shape[0] - 1), sigmas[:-1], sigmas[1:])
    if callback is None:
        (x, state), (states, _) = jax.lax.scan(body, (x, rule.init(x)), steps)
    else:
        step = jax.jit(functools.partial(body, report=True))
        carry, kept = (x, rule.init(x)), []
        for i in range(sigmas.shape[0] - 1):
            interval = tuple(a[i] for a in steps)
            carry, (x_i, denoised) = step(carry, interval)
            callback(x_i, denoised, interval[1])
            kept.append(x_i)
        x, state = carry
        states = jnp.stack(kept) if keep_states else None
    sigma_last = sigmas[last] if ends_in_zero is None else jnp.take(sigmas, last)
    out = rule.finish(denoise, x, state, sigma_last, noise_at(last), num_steps)
    if callback is not None:
        callback(x, out, sigma_last)
    if not keep_states:
        return None, out
    assert states is not None  # the scan (or the callback loop) kept them
    return jnp.concatenate([states, x[None]]), out


def trajectory(
    denoise: Denoiser,
    noise: jax.Array,
    sigmas: jax.Array | np.ndarray,
    solver: str | Solver = "heun",
    *,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Like ``sample``, but also returns the state x_i at every point (before any churn noise of
    step i): ([len(sigmas), *noise.shape], output). With a trailing 0 in a known schedule, the
    states are those of the points before it."""
    states, out = _run(denoise, noise, sigmas, solver, rng, keep_states=True)
    assert states is not None  # keep_states=True
    return states, out


def sample(
    denoise: Denoiser,
    noise: jax.Array,
    sigmas: jax.Array | np.ndarray,
    solver: str | Solver = "heun",
    *,
    rng: jax.Array | None = None,
    callback: Callback | None = None,
) -> jax.Array:
    """``len(sigmas)`` points from T to the last point: a solver step across each interval, then
    the model's clean prediction at the last point. A trailing 0 (k-diffusion's schedules) is
    the same thing: the last interval becomes the clean prediction at the point before it.

    ``noise`` is a standard normal batch; it is scaled by σ_0 here, and a known (not traced)
    ``noise`` whose standard deviation is not 1 is refused (``check_unit_noise``). ``sigmas``
    must be finite and strictly decreasing, > 0 but for a trailing 0 (checked when known).
    ``solver`` is a name in ``dew.samplers`` or a ``Solver`` (e.g. ``EDMStochastic(s_churn=10)``);
    stochastic solvers need ``rng``. NFE is ``nfe(solver, len(sigmas))``: (len − 1) + 1 for
    Euler and DPM-Solver++(2M), 2 (len − 1) + 1 for Heun (len without a trailing 0).

    ``callback(x, denoised, σ)``, when given, is called at each point with the state there, the
    model's clean prediction from it and σ, the last call with the output: a Python loop over
    one jitted step replaces the single compiled scan, so (outside an enclosing ``jit``) the
    callback receives concrete arrays as the sampler goes.
    """
    return _run(denoise, noise, sigmas, solver, rng, keep_states=False, callback=callback)[1]
