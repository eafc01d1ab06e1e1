"""``Programs``: a run's pure stages, jitted once with the layout's shardings.

``init(rng, batch) -> state`` (placed on the state's shardings), ``step(state, batch)`` (the state
donated), the multi-step program when ``steps_per_call`` > 1, ``eval(state, batch, rng)``, and
``debiased(ema, step)``, the debiased EMA replicated on every device that previews are drawn from.
``placement`` says where batches become device arrays, for every caller alike.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import optax

from dew.averaging import ema as ema_lib
from dew.averaging.averager import Averages
from dew.averaging.ema import EMASpec
from dew.contracts.objective import Objective
from dew.contracts.state import TrainState, num_updates
from dew.runtime.precompile import BackgroundCompile, abstract_like
from dew.training import typed_jax
from dew.training.calls import MultiStep, SingleStep
from dew.training.host_init import HostInit
from dew.training.precision import Precision
from dew.training.sharding import INIT_COMPILER_OPTIONS, Layout
from dew.training.steps import abstract_state, eval_program, init_program, make_multi_step, step_program


class Programs:
    """The jitted pure stages of one run (see the module docstring). ``averages``: the run's
    ``Averages`` (``Averages.from_config``), handed to every stage as they are. ``abstract`` is
    the state's shapes and dtypes; ``state_shardings`` where each leaf lives.

    ``places_ahead``: batches are placed on the mesh before the step (by the data stream's
    thread when it prepares batches ahead, or because several processes build global arrays
    from their shares); otherwise host batches go straight into the jitted step, which places
    them in C++ (a Python ``device_put`` costs the host more than the copy it would hide).
    ``skip_nonfinite``: ``make_step``'s (the skip policy's step keeps the old state for a
    flagged update; the stop policy's applies every update and flags it).
    """

    def __init__(
        self,
        objective: Objective,
        optimizer: optax.GradientTransformation,
        averages: Averages,
        layout: Layout,
        example_batch: dict[str, Any],
        *,
        accumulation: int = 1,
        steps_per_call: int = 1,
        places_ahead: bool = False,
        precision: Precision | None = None,
        skip_nonfinite: bool = True,
    ):
        self.layout, self.example_batch, self.places_ahead = layout, example_batch, places_ahead
        # The pure functions first (init with the state's shapes it gives), then the state's
        # shardings, then each function jitted.
        init = init_program(objective, optimizer, averages, accumulation=accumulation, precision=precision)
        self.abstract = abstract_state(init, example_batch)
        step = step_program(
            objective,
            optimizer,
            averages,
            accumulation=accumulation,
            precision=precision,
            skip_nonfinite=skip_nonfinite,
        )
        multi = make_multi_step(step, steps_per_call) if steps_per_call > 1 else None
        evaluate = eval_program(objective, averages, accumulation=accumulation)
        self.state_shardings = layout.state_shardings(self.abstract)
        self.init = layout.jit_init(init, self.abstract)
        self._init_program = init
        self.step = layout.jit_step(step, self.abstract)
        self.multi_step = None
        if multi is not None:
            self.multi_step = layout.jit_multi_step(multi, self.abstract, steps_per_call)
        self.steps_per_call = steps_per_call
        self.eval = typed_jax.jit(
            evaluate,
            in_shardings=(self.state_shardings, layout.batch_sharding, layout.replicated),
            out_shardings=layout.replicated,
        )
        self.debiased = typed_jax.jit(
            functools.partial(_debias, spec=averages.spec, accumulation=accumulation),
            in_shardings=(self.state_shardings.ema, layout.replicated),
            out_shardings=layout.replicated,
        )

    @functools.cached_property
    def host_init(self) -> HostInit:
        """``init`` run on the host's CPU, its result placed on the state's shardings
        (``dew.training.host_init``); built when first asked for."""
        return HostInit(self._init_program, self.state_shardings, INIT_COMPILER_OPTIONS)

    def template(self) -> Any:
        """The state's shapes, dtypes and shardings: what a checkpoint is read into."""
        return abstract_like(self.abstract, self.state_shardings)

    def place(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A batch as the step takes it: placed on the mesh when ``places_ahead`` (already
        placed arrays pass through), else as it is."""
        if not self.places_ahead or all(isinstance(v, jax.Array) for v in batch.values()):
            return batch
        return self.layout.place_batch(batch)

    def calls(self) -> SingleStep:
        """What ``fit`` calls: the step, or ``steps_per_call`` steps per call where it can."""
        if self.multi_step is None:
            return SingleStep(self.step)
        return MultiStep(self.step, self.steps_per_call, self.multi_step)

    def compile_in_background(self) -> BackgroundCompile:
        """Start compiling the program the first call runs (the multi-step one when
        ``steps_per_call`` > 1) from abstract arguments, in a thread (``dew.runtime.precompile``);
        the batches' shardings are those ``place`` gives, so the first call finds it compiled."""
        sharding = self.layout.batch_sharding if self.places_ahead else None
        batch = abstract_like(self.example_batch, sharding)
        state = abstract_like(self.abstract, self.state_shardings)
        if self.multi_step is not None:
            return BackgroundCompile(self.multi_step, state, (batch,) * self.steps_per_call)
        return BackgroundCompile(self.step, state, batch)


def _debias(ema: Any, step: jax.Array, *, spec: EMASpec | None, accumulation: int) -> Any:
    if spec is None:
        raise ValueError("debiased EMA: the averages hold no EMASpec (ClassicEMA built without one)")
    return ema_lib.debias(ema, spec, num_updates(step, accumulation))


def debiased_ema(state: TrainState, decay: float | EMASpec, accumulation: int = 1) -> Any:
    """The EMA parameters a user samples or exports with (``decay``: the run's EMASpec or β;
    ``Trainer.debiased_ema`` passes the run's own), eagerly on the host's arrays."""
    return ema_lib.debias(state.ema, decay, num_updates(int(jax.device_get(state.step)), accumulation))


__all__ = ["Programs", "debiased_ema"]
