"""SiT's ``Transport`` (willisma/SiT ``transport/__init__.py`` and ``transport.py``): which path,
what the network predicts, how the loss is weighted, and the time interval training and sampling
use; the training loss and the drift and score a sampler integrates.

A model here is any ``model(x, t) -> output`` with t continuous, [B] (conditions are closed over
by the caller). Nothing is drawn inside these functions but by ``sample_t``: the noise x0 and the
times are arguments, so the same loss is computed for the same draws (the goldens' form).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from dew.diffusion.interpolants import (
    LOSS_WEIGHTS,
    PATHS,
    PREDICTIONS,
    Path,
    expand_t_like_x,
    one_of,
)
from dew.schema import ConfigError

Array = jax.Array
Model = Callable[[Array, Array], Array]


def mean_flat(x: Array) -> Array:
    """The mean over every axis but the batch axis."""
    return jnp.mean(x, axis=tuple(range(1, x.ndim)))


def _eps_value(field: str, value: float | None) -> float | None:
    if value is not None and not (isinstance(value, int | float) and 0 <= value < 1):
        raise ConfigError(f"{field}={value!r} is invalid: expected a float in [0, 1) or None (the default)")
    return None if value is None else float(value)


@dataclasses.dataclass(frozen=True)
class Transport:
    """One interpolant with its prediction, loss weighting and time margins.

    Build it with ``Transport.create`` (the reference's ``create_transport``, whose ε rules it
    applies); the constructor takes the resolved values. ``path`` is a ``PATHS`` name,
    ``prediction`` one of ``PREDICTIONS``, ``loss_weight`` one of ``LOSS_WEIGHTS`` (None: unit
    weight; the weight applies only to score and noise predictions, as in the reference).
    """

    path: str = "Linear"
    prediction: str = "velocity"
    loss_weight: str | None = None
    train_eps: float = 0.0
    sample_eps: float = 0.0

    def __post_init__(self) -> None:
        one_of("path", self.path, tuple(PATHS))
        one_of("prediction", self.prediction, PREDICTIONS)
        one_of("loss_weight", self.loss_weight, LOSS_WEIGHTS)
        _eps_value("train_eps", self.train_eps)
        _eps_value("sample_eps", self.sample_eps)

    @classmethod
    def create(
        cls,
        path: str = "Linear",
        prediction: str = "velocity",
        loss_weight: str | None = None,
        train_eps: float | None = None,
        sample_eps: float | None = None,
    ) -> Transport:
        """``create_transport``'s resolution of the margins:

        * VP: train_eps defaults to 1e-5 and sample_eps to 1e-3;
        * Linear or GVP with a score or noise prediction: both default to 1e-3;
        * Linear or GVP with a velocity prediction: both are 0, whatever was given (the
          reference overrides them: velocity is stable on the whole interval).

        As in the reference, sample_eps takes its default only when train_eps is None too; a
        given train_eps without a sample_eps leaves it unset, which the reference would later
        fail on (``1 - None``): refused here with a ``ConfigError``.
        """
        one_of("path", path, tuple(PATHS))
        one_of("prediction", prediction, PREDICTIONS)
        one_of("loss_weight", loss_weight, LOSS_WEIGHTS)
        train_eps, sample_eps = _eps_value("train_eps", train_eps), _eps_value("sample_eps", sample_eps)
        if path == "VP":
            default_train, default_sample = 1e-5, 1e-3
        elif prediction != "velocity":
            default_train, default_sample = 1e-3, 1e-3
        else:
            return cls(path, prediction, loss_weight, 0.0, 0.0)
        resolved_sample = default_sample if train_eps is None else sample_eps
        resolved_train = default_train if train_eps is None else train_eps
        if resolved_sample is None:
            raise ConfigError(
                f"sample_eps=None is invalid with train_eps={train_eps!r} on the {path} path with the "
                f"{prediction} prediction: the reference leaves it unset then; expected a float in [0, 1)"
            )
        return cls(path, prediction, loss_weight, resolved_train, resolved_sample)

    @property
    def plan(self) -> Path:
        """The path's coefficients (``path_sampler``)."""
        return PATHS[self.path]()

    # --- the time interval ------------------------------------------------------------------------
    def check_interval(
        self,
        *,
        diffusion_form: str = "SBDM",
        sde: bool = False,
        reverse: bool = False,
        eval: bool = False,
        last_step_size: float = 0.0,
    ) -> tuple[float, float]:
        """``check_interval``: (t0, t1), the ends training draws t between (``eval=False``, with
        train_eps) or a sampler integrates over (``eval=True``, with sample_eps).

        VP: [0, 1 − ε] (an SDE with a last step stops at 1 − last_step_size instead). Linear and
        GVP with a score or noise prediction, or sampled by an SDE: t0 = ε when the prediction is
        not velocity or the SDE's diffusion is SBDM, else 0; t1 as for VP. Otherwise [0, 1].
        ``reverse`` maps both ends t -> 1 − t."""
        t0, t1 = 0.0, 1.0
        eps = self.sample_eps if eval else self.train_eps
        if self.path == "VP":
            t1 = 1 - eps if (not sde or last_step_size == 0) else 1 - last_step_size
        elif self.prediction != "velocity" or sde:
            t0 = eps if (diffusion_form == "SBDM" and sde) or self.prediction != "velocity" else 0
            t1 = 1 - eps if (not sde or last_step_size == 0) else 1 - last_step_size
        if reverse:
            t0, t1 = 1 - t0, 1 - t1
        return t0, t1

    def sample_t(self, rng: Array, batch: int) -> Array:
        """``sample``'s times: t ~ U(t0, t1) over the training interval, [batch] float32."""
        t0, t1 = self.check_interval()
        return jax.random.uniform(rng, (batch,)) * (t1 - t0) + t0

    # --- training ---------------------------------------------------------------------------------
    def training_losses(self, model: Model, x1: Array, t: Array, x0: Array) -> dict[str, Array]:
        """``training_losses`` for given times ``t`` [B] and noise ``x0``: {"pred", "loss"}, the
        loss per example [B].

        velocity: ‖v_θ(x_t, t) − u_t‖²; noise: w ‖ε_θ − x0‖²; score: w ‖s_θ σ_t + x0‖², with
        w = 1 (None), (g/σ_t)² (velocity) or g/σ_t² (likelihood), g the drift's second term.
        """
        plan = self.plan
        t, xt, ut = plan.plan(t, x0, x1)
        pred = model(xt, t)
        if pred.shape != xt.shape:
            raise ValueError(f"training_losses: the model returned shape {pred.shape}, expected {xt.shape}")
        if self.prediction == "velocity":
            return {"pred": pred, "loss": mean_flat((pred - ut) ** 2)}
        _, drift_var = plan.drift(xt, t)
        sigma_t, _ = plan.sigma(expand_t_like_x(t, xt))
        if self.loss_weight == "velocity":
            weight = (drift_var / sigma_t) ** 2
        elif self.loss_weight == "likelihood":
            weight = drift_var / (sigma_t**2)
        else:
            weight = 1
        if self.prediction == "noise":
            return {"pred": pred, "loss": mean_flat(weight * ((pred - x0) ** 2))}
        return {"pred": pred, "loss": mean_flat(weight * ((pred * sigma_t + x0) ** 2))}

    # --- what samplers integrate ----------------------------------------------------------------
    def drift_from_output(self, output: Array, x: Array, t: Array) -> Array:
        """``get_drift``'s probability-flow velocity from a model output at (x, t)."""
        if self.prediction == "velocity":
            return output
        plan = self.plan
        drift_mean, drift_var = plan.drift(x, t)
        if self.prediction == "score":
            return -drift_mean + drift_var * output
        sigma_t, _ = plan.sigma(expand_t_like_x(t, x))
        return -drift_mean + drift_var * (output / -sigma_t)

    def score_from_output(self, output: Array, x: Array, t: Array) -> Array:
        """``get_score``: ∇ log p_t(x) from a model output at (x, t)."""
        if self.prediction == "score":
            return output
        plan = self.plan
        if self.prediction == "noise":
            return output / -plan.sigma(expand_t_like_x(t, x))[0]
        return plan.score_from_velocity(output, x, t)

    def drift(self, model: Model) -> Model:
        """(x, t) -> the probability-flow ODE's velocity (``get_drift``)."""
        return lambda x, t: self.drift_from_output(model(x, t), x, t)

    def score(self, model: Model) -> Model:
        """(x, t) -> the score (``get_score``)."""
        return lambda x, t: self.score_from_output(model(x, t), x, t)
