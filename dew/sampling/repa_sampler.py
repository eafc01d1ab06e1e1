"""REPA's own samplers (sihyun-yu/REPA ``samplers.py``, chosen by ``generate.py --mode``):
``euler_sampler`` (``ode``: Euler, or Heun with ``--heun``) and ``euler_maruyama_sampler``
(``sde``), the sampler behind REPA's published FID 1.42 (``--mode=sde --num-steps=250
--cfg-scale=1.8 --guidance-high=0.7``).

**Time.** REPA runs t from 1 (noise) to 0 (data), x_t = α_t x + σ_t ε, and its network
predicts v = dx/dt. dew's ``interpolant`` networks run SiT's time s = 1 − t and predict
v_S = dx/ds = −v (``dew.objectives.repa``), so each step here calls the network at s = 1 − t
(float32 of the float64 value) and uses v = −v_S; a non-velocity prediction is first turned
into v_S by the transport's ``drift_from_output``. ``path_type`` is the transport's path:
REPA's ``linear`` (α = 1 − t, σ = t) is SiT's ``Linear``, its ``cosine`` (α = cos(πt/2),
σ = sin(πt/2)) SiT's ``GVP``, both mirrored; no other path has a REPA sampler.

**ODE** (``euler_sampler``): the float64 grid t_i = ``torch.linspace(1, 0, N + 1)`` and

    x_{i+1} = x_i + (t_{i+1} − t_i) · v(x_i, t_i)                       (Euler)
    x_{i+1} = x_i + (t_{i+1} − t_i) · ½ (v(x_i, t_i) + v(x̂, t_{i+1}))   (Heun, x̂ the Euler
                                                                       step; not on the last step)

**SDE** (``euler_maruyama_sampler``): the grid t = ``linspace(1, 0.04, N)`` then 0, the
diffusion w(t) = 2t, the score from the velocity (``get_score_from_velocity``)

    r = α/α̇,  var = σ² − r σ̇ σ,  s(x, t) = (r · v − x) / var,  d = v − ½ w s,

N − 1 steps x' = x + d · dt + √w · √|dt| · ε, then the last step from 0.04 to 0 without noise,
x + d · dt (the output is that mean).

**Guidance.** REPA guides the whole drift (all channels) for t_cur ∈ [low, high] and calls
the network on the conditional batch alone elsewhere; dew's guided network (the
``interpolant`` objective's ``guided_network`` with ``cfg_channels`` = all and the interval
mirrored to [1 − high, 1 − low]) guides v on the doubled batch, the same drift (d is affine in
v with weights summing to one). The guided network decides the interval at the time it is
called with, or at ``guide_time`` when given: Heun's second evaluation is passed the step's
t_cur there, because REPA guides it iff its first evaluation was guided.

The state runs in the input's dtype (float32 here; REPA accumulates in float64 and feeds the
network float32), the grid and its coefficients are computed in float64 on the host. The SDE's
ε of step i is ``step_noise(rng, i, x.shape)`` or row i of ``noises`` ([N − 1, *x.shape]),
which is how the goldens inject the reference's draws (third_party/repa/samplers.npz).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.diffusion.interpolants import one_of
from dew.diffusion.transport import Transport
from dew.sampling.solvers import step_noise
from dew.sampling.transport_ode import torch_linspace
from dew.schema import ConfigError

Array = jax.Array
Model = Callable[..., Array]
MODES = ("ode", "sde")
#: dew's transport path -> REPA's ``path_type``
PATH_TYPES = {"Linear": "linear", "GVP": "cosine"}
SDE_LAST_T = 0.04  # euler_maruyama_sampler's last noisy time


def path_type(transport: Transport) -> str:
    """REPA's ``path_type`` for ``transport``'s path (a ``ConfigError`` for any other path)."""
    if transport.path not in PATH_TYPES:
        raise ConfigError(
            f"config.objective.path={transport.path!r} has no REPA sampler: expected one of "
            f"{sorted(PATH_TYPES)} (REPA's linear and cosine paths)"
        )
    return PATH_TYPES[transport.path]


def path_coefficients(t: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(r, var) of ``get_score_from_velocity`` at REPA times ``t`` (float64): s = (r·v − x)/var."""
    if kind == "linear":
        alpha, d_alpha = 1 - t, -np.ones_like(t)
        sigma, d_sigma = t, np.ones_like(t)
    else:
        alpha, sigma = np.cos(t * np.pi / 2), np.sin(t * np.pi / 2)
        d_alpha, d_sigma = -np.pi / 2 * np.sin(t * np.pi / 2), np.pi / 2 * np.cos(t * np.pi / 2)
    ratio = alpha / d_alpha
    return ratio, sigma**2 - ratio * d_sigma * sigma


@dataclasses.dataclass(frozen=True)
class RepaSampler:
    """``generate.py``'s ``--mode`` (``ode``/``sde``), ``--num-steps`` and ``--heun`` (ODE only;
    REPA's SDE ignores it). The registered defaults are ``generate.py``'s (ODE, 50 steps) and the
    published FID's (SDE, 250 steps)."""

    mode: str = "sde"
    num_steps: int = 250
    heun: bool = False
    kind = "repa_sampler"

    def __post_init__(self) -> None:
        one_of("mode", self.mode, MODES)
        if not (isinstance(self.num_steps, int) and self.num_steps >= 2):
            raise ConfigError(f"num_steps={self.num_steps!r} is invalid: expected an int >= 2")
        if self.heun and self.mode != "ode":
            raise ConfigError("heun=True is invalid for REPA's sde mode: expected heun=False (ode only)")

    @property
    def stochastic(self) -> bool:
        return self.mode == "sde"

    def grid(self) -> np.ndarray:
        """REPA's float64 times t (1 at the noise): N + 1 points for the ODE, N + 1 (the last 0)
        for the SDE."""
        if self.mode == "ode":
            return torch_linspace(1.0, 0.0, self.num_steps + 1, np.float64)
        return np.concatenate([torch_linspace(1.0, SDE_LAST_T, self.num_steps, np.float64), [0.0]])

    def trajectory(
        self,
        transport: Transport,
        model: Model,
        x: Array,
        rng: Array | None = None,
        *,
        noises: Array | None = None,
        keep: bool = True,
    ) -> Array:
        """[num_steps, *x.shape]: the state after each step, the last row the output
        (``keep=False``: the output alone, [1, *x.shape]). The SDE needs ``rng`` or ``noises``."""
        kind = path_type(transport)
        t = self.grid()
        dtype = x.dtype
        if self.mode == "sde":
            if noises is None and rng is None:
                raise ValueError("RepaSampler: the sde mode needs rng= (or noises=)")
            if noises is not None and noises.shape != (self.num_steps - 1, *x.shape):
                raise ValueError(
                    f"RepaSampler: noises has shape {noises.shape}, expected {(self.num_steps - 1, *x.shape)}"
                )

        def velocity(y: Array, s: Array, guide_time: Array | None = None) -> Array:
            """REPA's v(y, t) from dew's network at s = 1 − t (a scalar here)."""
            times = jnp.full((y.shape[0],), s, dtype)
            out = model(y, times) if guide_time is None else model(y, times, guide_time=guide_time)
            return -transport.drift_from_output(out, y, times)

        if self.mode == "ode":
            return self._ode(velocity, x, t, keep)
        return self._sde(velocity, x, t, kind, rng, noises, keep)

    def _ode(self, velocity, x: Array, t: np.ndarray, keep: bool) -> Array:
        s = jnp.asarray(1.0 - t, x.dtype)  # the network's time at each grid point
        dt = jnp.asarray(t[1:] - t[:-1], x.dtype)
        heun = jnp.asarray([self.heun and i < self.num_steps - 1 for i in range(self.num_steps)])

        def body(y, step):
            s_cur, s_next, h, second = step
            d_cur = velocity(y, s_cur)
            y_next = y + h * d_cur
            if self.heun:

                def corrected():
                    d_prime = velocity(y_next, s_next, guide_time=jnp.full((y.shape[0],), s_cur, y.dtype))
                    return y + h * (0.5 * d_cur + 0.5 * d_prime)

                y_next = jax.lax.cond(second, corrected, lambda: y_next)
            return y_next, (y_next if keep else None)

        y_last, states = jax.lax.scan(body, x, (s[:-1], s[1:], dt, heun))
        return _rows(y_last, states, keep)

    def _sde(self, velocity, x: Array, t: np.ndarray, kind: str, rng, noises, keep: bool) -> Array:
        t_cur, t_next = t[:-1], t[1:]
        ratio, var = path_coefficients(t_cur, kind)
        diffusion = 2 * t_cur  # compute_diffusion
        dt = t_next - t_cur
        columns = {
            "s": 1.0 - t_cur,
            "dt": dt,
            "ratio": ratio,
            "var": var,
            "half_w": 0.5 * diffusion,
            "noise_scale": np.sqrt(diffusion) * np.sqrt(np.abs(dt)),
        }
        steps = {k: jnp.asarray(v, x.dtype) for k, v in columns.items()}

        def drift(y, c):
            v = velocity(y, c["s"])
            score = (c["ratio"] * v - y) / c["var"]
            return v - c["half_w"] * score

        def body(y, step):
            i, c = step
            eps = noises[i].astype(y.dtype) if noises is not None else step_noise(rng, i, y.shape, y.dtype)
            y_next = y + drift(y, c) * c["dt"] + c["noise_scale"] * eps
            return y_next, (y_next if keep else None)

        noisy = jax.tree.map(lambda a: a[:-1], steps)
        y_last, states = jax.lax.scan(body, x, (jnp.arange(self.num_steps - 1), noisy))
        last = jax.tree.map(lambda a: a[-1], steps)
        out = y_last + last["dt"] * drift(y_last, last)  # the last step: the mean, no noise
        if not keep:
            return out[None]
        assert states is not None  # the scan kept every state
        return jnp.concatenate([states, out[None]])

    def __call__(self, model: Model, noise: Array, schedule: Transport, rng: Array | None = None) -> Array:
        """The ``Sampler`` interface (``dew.sampling.interface``): ``sample(schedule, model,
        noise, rng)``, ``schedule`` being the transport whose path is sampled."""
        return self.sample(schedule, model, noise, rng)

    def sample(
        self, transport: Transport, model: Model, x: Array, rng: Array | None = None, *, noises=None
    ) -> Array:
        """The output from noise ``x``."""
        return self.trajectory(transport, model, x, rng, noises=noises, keep=False)[-1]


def _rows(last: Array, states: Array | None, keep: bool) -> Array:
    if not keep:
        return last[None]
    assert states is not None  # the scan kept every state
    return states


#: REPA's samplers, registered in ``dew.samplers``: ``generate.py``'s modes at its default 50
#: steps, and ``repa_sde`` at the published FID's 250.
REPA_SAMPLERS = {
    "repa_sde": RepaSampler(),
    "repa_ode": RepaSampler(mode="ode", num_steps=50),
    "repa_ode_heun": RepaSampler(mode="ode", num_steps=50, heun=True),
}
for _name, _sampler in REPA_SAMPLERS.items():
    registry.samplers.register(_name, _sampler)
