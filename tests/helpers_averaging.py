"""A tiny run of the pure steps with both averages, written against the API of commit 87d5f86
(``make_init(objective, optimizer, EMASpec, power_ema=PowerEMA)``), which the current code still
takes: the same function ran on the old code to record ``test_averaging.RECORDED`` and
``data/averages_checkpoint_87d5f86``.

Elementwise arithmetic only (no matmul, no reduction feeds the parameters: the loss's sum only
reaches them through its elementwise gradient), so the recorded bits do not depend on which CPU
kernel runs."""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew.averaging.ema import EMASpec
from dew.averaging.power_ema import PowerEMA
from dew.inputs import Field, InputSpec
from dew.training.objective import Aux, Objective
from dew.training.steps import make_init, make_step

SPEC = EMASpec(half_life=3.0, ramp_up=0.5, tracks=lambda path: path.startswith("w"))
STD_RELS = (0.05, 0.1)


class Elementwise(Objective):
    input_spec = InputSpec(Field("x", (4,)))

    def init(self, rng, batch):
        return {"w": jax.random.normal(rng, (3, 4)), "b": jnp.ones(4)}

    def loss(self, params, rng, batch, step):
        residual = params["w"] * batch["x"] + params["b"] - jnp.sin(batch["x"])
        return jnp.sum(residual**2), ({}, Aux())


def tiny_run(accumulation: int = 1, power: bool = True, steps: int = 6, **averaging):
    """The state after ``steps`` train steps (Adam, the ramped half-life EMA of ``w`` only, and
    with ``power`` the EDM2 profiles ``STD_RELS``). ``averaging`` replaces the averaging
    arguments (e.g. ``ema=Averages(...)`` for the one-argument form)."""
    objective, optimizer = Elementwise(), optax.adam(0.05)
    batch = {"x": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
    pieces = averaging or {"ema": SPEC, "power_ema": PowerEMA(STD_RELS, 1) if power else None}
    init = jax.jit(make_init(objective, optimizer, accumulation=accumulation, **pieces))
    step = jax.jit(make_step(objective, optimizer, accumulation=accumulation, **pieces))
    state = init(jax.random.PRNGKey(3), batch)
    for _ in range(steps):
        state, _ = step(state, batch)
    return state


def digest(state) -> str:
    """sha256 (16 hex digits) of the params, both averages, the optimizer state and the EMA law."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves((state.params, state.ema, state.power_ema, state.opt_state, state.ema_law)):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":  # what RECORDED holds, on the code of the checkout it runs in
    for k, power in [(1, False), (1, True), (2, True)]:
        print(k, power, digest(tiny_run(k, power)))
