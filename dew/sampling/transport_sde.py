"""SiT's SDE sampler (``Sampler.sample_sde`` of willisma/SiT ``transport/transport.py`` with its
``integrators.sde``): from noise at t0 to data at t1 along

    dx = [v(x, t) + w(t) s(x, t)] dt + √(2 w(t)) dW,

v the probability-flow velocity, s the score, w the diffusion coefficient of ``diffusion_form``
scaled by ``diffusion_norm`` (``Path.diffusion``), then one last step without noise.

The grid is torch's float32 ``linspace(t0, t1, num_steps)``, t1 = 1 − ``last_step_size`` when
there is a last step, and the ``num_steps − 1`` steps of size dt = t_1 − t_0 are:

* ``Euler`` (Euler–Maruyama): x' = x + f(x, t) dt + √(2 w(t)) √dt ε;
* ``Heun``: x̂ = x + √(2 w(t)) √dt ε, then a Heun step of the drift from x̂:
  K1 = f(x̂, t), K2 = f(x̂ + dt K1, t + dt), x' = x̂ + ½ dt (K1 + K2).

The last step at t1 (``last_step``): ``Mean`` x + f(x, t1) h, ``Euler`` x + v(x, t1) h (h =
``last_step_size``), ``Tweedie`` x/α + σ²/α · s(x, t1) with α, σ the path's at t1, or None (x
itself; the reference then sets h = 0, so t1 is the interval's end). The trajectory has
``num_steps`` states: one after each step and the last step's output.

The noise ε of step i is ``step_noise(rng, i, x.shape)`` (``dew.sampling.solvers``), or row i of
``noises`` ([num_steps − 1, *x.shape]) when given, which is how the goldens inject the
reference's draws.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from dew import registry
from dew.diffusion.interpolants import DIFFUSION_ALIASES, DIFFUSION_FORMS, one_of
from dew.diffusion.transport import Transport
from dew.sampling.solvers import step_noise
from dew.sampling.transport_ode import torch_linspace
from dew.schema import ConfigError

Array = jax.Array
Model = Callable[[Array, Array], Array]
SDE_METHODS = ("Euler", "Heun")
LAST_STEPS = (None, "Mean", "Tweedie", "Euler")


@dataclasses.dataclass(frozen=True)
class TransportSDE:
    """``sample_sde``'s settings; ``sample`` draws. The defaults are the reference's command line
    (``parse_sde_args``: Euler, the ``sigma`` form, norm 1, the ``Mean`` last step of size 0.04)
    with its 250 sampling steps."""

    method: str = "Euler"
    diffusion_form: str = "sigma"
    diffusion_norm: float = 1.0
    last_step: str | None = "Mean"
    last_step_size: float = 0.04
    num_steps: int = 250
    kind = "transport_sde"
    stochastic = True

    def __post_init__(self) -> None:
        one_of("sampling_method", self.method, SDE_METHODS)
        one_of(
            "diffusion_form",
            DIFFUSION_ALIASES.get(self.diffusion_form, self.diffusion_form),
            DIFFUSION_FORMS,
        )
        one_of("last_step", self.last_step, LAST_STEPS)
        if not (isinstance(self.num_steps, int) and self.num_steps >= 2):
            raise ConfigError(f"num_steps={self.num_steps!r} is invalid: expected an int >= 2")
        if not 0 <= self.last_step_size < 1:
            raise ConfigError(
                f"last_step_size={self.last_step_size!r} is invalid: expected a float in [0, 1)"
            )

    @property
    def step_size(self) -> float:
        """The last step's size (0 without one, as the reference resets it)."""
        return 0.0 if self.last_step is None else self.last_step_size

    def interval(self, transport: Transport) -> tuple[float, float]:
        return transport.check_interval(
            diffusion_form=self.diffusion_form, sde=True, eval=True, last_step_size=self.step_size
        )

    def grid(self, transport: Transport):
        """The step times, float32 (``num_steps`` points; the last is where the last step starts)."""
        return torch_linspace(*self.interval(transport), self.num_steps)

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
        """[num_steps, *x.shape]: the state after each of the num_steps − 1 steps, then the last
        step's output (``keep=False``: the output alone, [1, *x.shape]). Needs ``rng`` or
        ``noises``."""
        if noises is None and rng is None:
            raise ValueError("TransportSDE: a stochastic sampler needs rng= (or noises=)")
        if noises is not None and noises.shape != (self.num_steps - 1, *x.shape):
            raise ValueError(
                f"TransportSDE: noises has shape {noises.shape}, expected {(self.num_steps - 1, *x.shape)}"
            )
        plan = transport.plan
        form, norm = self.diffusion_form, self.diffusion_norm
        grid = jnp.asarray(self.grid(transport))
        dt = grid[1] - grid[0]
        t1 = float(self.interval(transport)[1])

        def diffusion(x, t):
            return plan.diffusion(x, t, form, norm)

        def drift_and_score(x, t):
            out = model(x, t)
            return transport.drift_from_output(out, x, t), transport.score_from_output(out, x, t)

        def sde_drift(x, t):
            v, s = drift_and_score(x, t)
            return v + diffusion(x, t) * s

        def body(x, step):
            i, t_i = step
            if noises is not None:
                w = noises[i]
            else:
                assert rng is not None  # raised above without rng or noises
                w = step_noise(rng, i, x.shape, x.dtype)
            dw = w * jnp.sqrt(dt)
            t = jnp.ones((x.shape[0],), x.dtype) * t_i
            if self.method == "Euler":
                x_next = x + sde_drift(x, t) * dt + jnp.sqrt(2 * diffusion(x, t)) * dw
            else:
                xhat = x + jnp.sqrt(2 * diffusion(x, t)) * dw
                k1 = sde_drift(xhat, t)
                xp = xhat + dt * k1
                k2 = sde_drift(xp, t + dt)
                x_next = xhat + 0.5 * dt * (k1 + k2)
            return x_next, (x_next if keep else None)

        steps = (jnp.arange(self.num_steps - 1), grid[:-1])
        x_last, states = jax.lax.scan(body, x, steps)
        t_end = jnp.ones((x.shape[0],), x.dtype) * t1
        h = self.step_size
        if self.last_step is None:
            out = x_last
        elif self.last_step == "Mean":
            out = x_last + sde_drift(x_last, t_end) * h
        elif self.last_step == "Euler":
            out = x_last + drift_and_score(x_last, t_end)[0] * h
        else:
            alpha, sigma = plan.alpha(t_end)[0][0], plan.sigma(t_end)[0][0]
            out = x_last / alpha + (sigma**2) / alpha * drift_and_score(x_last, t_end)[1]
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
        """The last step's output from noise ``x``."""
        return self.trajectory(transport, model, x, rng, noises=noises, keep=False)[-1]


#: SiT's SDE samplers, registered in ``dew.samplers``.
SDE_SAMPLERS = {"transport_sde": TransportSDE(), "transport_sde_heun": TransportSDE(method="Heun")}
for _name, _sampler in SDE_SAMPLERS.items():
    registry.samplers.register(_name, _sampler)
