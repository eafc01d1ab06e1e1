"""SiT's ODE sampler (``Sampler.sample_ode`` of willisma/SiT ``transport/transport.py`` with its
``integrators.ode``): the probability-flow ODE dx/dt = v(x, t) of a ``Transport`` from noise at
t0 to data at t1, integrated as torchdiffeq's ``odeint`` does it.

``method`` is a torchdiffeq name: ``euler`` and ``heun2`` step on the output grid itself
(``num_steps`` points, ``num_steps − 1`` steps); ``dopri5`` is adaptive (``dew.sampling.dopri5``,
``atol``/``rtol``) and reports its interpolant at the ``num_steps`` grid points. The grid is
torch's float32 ``linspace(t0, t1, num_steps)`` over ``Transport.check_interval(eval=True)``
(``reverse``: from data to noise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.diffusion.interpolants import one_of
from dew.diffusion.transport import Transport
from dew.sampling import dopri5
from dew.schema import ConfigError

Array = jax.Array
Model = Callable[[Array, Array], Array]
ODE_METHODS = ("dopri5", "euler", "heun2")


def torch_linspace(start: float, end: float, steps: int, dtype: type = np.float32) -> np.ndarray:
    """torch.linspace(start, end, steps, dtype=dtype) (float32 or float64), value for value: the
    first half counted up from ``start``, the second half down from ``end``, with step
    (end − start)/(steps − 1). torch's float64 CPU kernel fuses each multiply-add (one rounding:
    third_party/repa/samplers.npz holds its grids), computed here exactly."""
    start_, end_ = dtype(start), dtype(end)
    if steps == 1:
        return np.asarray([start_], dtype)
    step = dtype((end_ - start_) / dtype(steps - 1))
    idx = np.arange(steps)
    halfway = steps // 2
    if dtype is np.float64:
        a, b, h = Fraction(float(start_)), Fraction(float(end_)), Fraction(float(step))
        return np.asarray(
            [float(a + h * i if i < halfway else b - h * (steps - i - 1)) for i in range(steps)]
        )
    up = start_ + step * idx.astype(dtype)
    down = end_ - step * (steps - idx - 1).astype(dtype)
    return np.where(idx < halfway, up, down).astype(dtype)


def _field(model: Model) -> Callable[[Array, Array], Array]:
    """func(t, x) as torchdiffeq calls the sampler's ``_fn``: a scalar t broadcast over the batch."""
    return lambda t, x: model(x, jnp.ones((x.shape[0],), x.dtype) * t)


def fixed_grid(
    method: str, func: Callable[[Array, Array], Array], y0: Array, grid: Array, keep: bool = True
) -> Array:
    """torchdiffeq's ``euler`` (y + dt f(t0, y)) or ``heun2`` (k1 = f(t0, y), k2 = f(t0 + dt,
    y + dt k1), y + dt (½ k1 + ½ k2)) on ``grid``: [len(grid), *y0.shape], the first row y0
    (``keep=False``: only the last state, [1, *y0.shape])."""

    def body(y, interval):
        t0, t1 = interval
        dt = t1 - t0
        k1 = func(t0, y)
        if method == "euler":
            y_next = y + dt * k1
        else:
            k2 = func(t0 + dt * 1.0, y + dt * k1 * 1.0)
            y_next = y + dt * (k1 * 0.5 + k2 * 0.5)
        return y_next, (y_next if keep else None)

    y_last, ys = jax.lax.scan(body, y0, (grid[:-1], grid[1:]))
    if not keep:
        return y_last[None]
    assert ys is not None  # the scan kept every state
    return jnp.concatenate([y0[None], ys])


@dataclasses.dataclass(frozen=True)
class TransportODE:
    """``sample_ode``'s settings; ``sample`` draws. The defaults are willisma/SiT
    ``transport.Sampler.sample_ode``'s own signature defaults: dopri5, atol 1e-6, rtol 1e-3,
    ``num_steps=50`` (for dopri5 the points the solution is read at, by interpolation; Euler and
    Heun take that many steps). SiT's ``sample.py`` / ``sample_ddp.py ODE`` share the method
    and tolerances (``train_utils.parse_ode_args``) but pass ``--num-sampling-steps``, default
    250: set ``num_steps=250`` to run their command line."""

    method: str = "dopri5"
    num_steps: int = 50
    atol: float = 1e-6
    rtol: float = 1e-3
    reverse: bool = False
    kind = "transport_ode"

    def __post_init__(self) -> None:
        one_of("sampling_method", self.method, ODE_METHODS)
        if not (isinstance(self.num_steps, int) and self.num_steps >= 2):
            raise ConfigError(f"num_steps={self.num_steps!r} is invalid: expected an int >= 2")
        for name in ("atol", "rtol"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid: expected a float > 0")

    def grid(self, transport: Transport) -> np.ndarray:
        """The output times, float32."""
        t0, t1 = transport.check_interval(sde=False, eval=True, reverse=self.reverse, last_step_size=0.0)
        return torch_linspace(t0, t1, self.num_steps)

    def trajectory(self, transport: Transport, model: Model, x: Array) -> tuple[Array, dopri5.Stats | None]:
        """([num_steps, *x.shape] states at the grid times, the adaptive run's statistics or None)."""
        func = _field(transport.drift(model))
        grid = self.grid(transport)
        if self.method == "dopri5":
            return dopri5.odeint(func, x, grid, rtol=self.rtol, atol=self.atol)
        return fixed_grid(self.method, func, x, jnp.asarray(grid)), None

    def __call__(self, model: Model, noise: Array, schedule: Transport, rng: Array | None = None) -> Array:
        """The ``Sampler`` interface (``dew.sampling.interface``): ``sample(schedule, model,
        noise, rng)``, ``schedule`` being the transport whose path is sampled."""
        return self.sample(schedule, model, noise, rng)

    def sample(self, transport: Transport, model: Model, x: Array, rng: Array | None = None) -> Array:
        """The state at the last grid time from noise ``x`` (``rng`` is unused: deterministic).

        The same value as ``trajectory(...)[0][-1]`` without keeping the other states: the
        adaptive solver's steps do not depend on the output times (it never clips a step to
        one), so it is asked for the last time alone."""
        del rng
        func = _field(transport.drift(model))
        grid = self.grid(transport)
        if self.method == "dopri5":
            ends = grid[[0, -1]]
            return dopri5.odeint(func, x, ends, rtol=self.rtol, atol=self.atol)[0][-1]
        return fixed_grid(self.method, func, x, jnp.asarray(grid), keep=False)[-1]


#: SiT's ODE samplers by torchdiffeq method, registered in ``dew.samplers``.
ODE_SAMPLERS = {
    "transport_ode": TransportODE(),
    "transport_ode_euler": TransportODE(method="euler"),
    "transport_ode_heun2": TransportODE(method="heun2"),
}
for _name, _sampler in ODE_SAMPLERS.items():
    registry.samplers.register(_name, _sampler)
