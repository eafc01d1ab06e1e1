"""One interface for every sampler: ``Sampler``, called as ``sampler(model, noise, schedule, rng)``
and returning the samples (the same shape as ``noise``).

dew samples four families of models, each with its own network call and its own schedule; the
interface names what they share and leaves those two to the family (the type parameters):

* EDM's σ-ODE/SDE (objectives ``diffusion``, ``edm2``): a ``Solver`` of
  ``dew.sampling.solvers`` (Euler, Heun, EDM's stochastic, DPM-Solver++(2M)); ``model`` is the
  denoiser ``D(x, σ)``, ``schedule`` the σ points [N].
* SiT / REPA transport (``interpolant``): ``TransportODE``, ``TransportSDE``, ``RepaSampler``;
  ``model(x, t)`` in SiT's time (0 noise, 1 data), ``schedule`` a
  ``dew.diffusion.transport.Transport`` (the path; the sampler holds its number of steps).
* DiT's iDDPM (``iddpm``): ``DDPMLoop`` (ancestral DDPM or DDIM); ``model(x, t)`` on integer
  steps (the network's raw output), ``schedule`` a respaced
  ``dew.diffusion.iddpm.GaussianDiffusion``.
* MeanFlow (``meanflow``, ``imeanflow``): ``MeanFlowLoop``; ``model`` the average velocity
  ``u(z, t, h)``, ``schedule`` the t points, 1 … 0.

``noise`` is the standard normal starting point (a σ solver scales it by σ_0 itself); ``rng``
draws any noise the sampler adds on the way (None for a deterministic one). Each implementation
calls its family's own loop and adds no arithmetic, so a sample drawn through the interface is the
family's sample, bit for bit (``tests/test_sampler_interface.py``). A new sampler goes into its
family's module and implements ``__call__`` with this signature; one that fits no family states
its ``model`` and ``schedule`` types and joins the table. Every sampler registered in
``dew.samplers`` implements it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import jax

from dew.sampling.meanflow import AverageVelocity, sample_mean_flow

if TYPE_CHECKING:
    from dew.diffusion.iddpm import GaussianDiffusion

ModelT = TypeVar("ModelT", contravariant=True)
ScheduleT = TypeVar("ScheduleT", contravariant=True)


class Sampler(Protocol[ModelT, ScheduleT]):
    """A sampler: ``sampler(model, noise, schedule, rng)`` -> samples shaped as ``noise`` (the
    module docstring's table gives each family's ``model`` and ``schedule``)."""

    def __call__(
        self, model: ModelT, noise: jax.Array, schedule: ScheduleT, rng: jax.Array | None = None
    ) -> jax.Array: ...


@dataclasses.dataclass(frozen=True)
class DDPMLoop:
    """DiT's iDDPM sampling as a ``Sampler``: ``GaussianDiffusion.sample_loop`` with ``method``
    ("ddpm": ``p_sample_loop``; "ddim": ``ddim_sample_loop`` with ``eta``) and
    ``clip_denoised`` (DiT samples without clipping), keeping only the sample. Its step noises
    are drawn from ``rng`` (required)."""

    method: str = "ddpm"
    clip_denoised: bool = False
    eta: float = 0.0

    def __call__(
        self,
        model: Callable[[jax.Array, jax.Array], jax.Array],
        noise: jax.Array,
        schedule: GaussianDiffusion,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        return schedule.sample_loop(
            model,
            noise,
            rng=rng,
            clip_denoised=self.clip_denoised,
            method=self.method,
            eta=self.eta,
            trajectory=False,
        )


@dataclasses.dataclass(frozen=True)
class MeanFlowLoop:
    """MeanFlow's one- or few-step sampling as a ``Sampler``: ``sample_mean_flow`` along the t
    points of ``schedule`` (1 … 0), one network evaluation per interval; deterministic (``rng``
    unused)."""

    def __call__(
        self,
        model: AverageVelocity,
        noise: jax.Array,
        schedule: Sequence[float],
        rng: jax.Array | None = None,
    ) -> jax.Array:
        del rng
        return sample_mean_flow(model, noise, schedule)


__all__ = ["DDPMLoop", "MeanFlowLoop", "Sampler"]
