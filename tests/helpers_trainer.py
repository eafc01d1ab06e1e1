"""A small deterministic objective for trainer tests whose answers must not depend on noise.

Regression of y = sin(x·w*) with a two-layer MLP under mean squared error: the loss of a batch
is the mean of per-example losses and ignores the rng, so k micro-batches of B and one batch of
kB give the same gradient, and any mesh gives the same numbers up to float reduction order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dew.inputs import Field, InputSpec
from dew.objectives.base import Aux, Objective, Step
from dew.training.state import TrainState


class Regression(Objective):
    """MLP regression; ``nan_at`` (an optimizer step index) poisons that step's loss."""

    input_spec = InputSpec(Field("x", (8,)))

    def __init__(self, hidden: int = 16, nan_at: int | None = None):
        self.hidden, self.nan_at = hidden, nan_at

    def init(self, rng, batch):
        k1, k2 = jax.random.split(rng)
        d = batch["x"].shape[-1]
        return {
            "hidden": {
                "w": jax.random.normal(k1, (d, self.hidden)) / np.sqrt(d),
                "b": jnp.zeros(self.hidden),
            },
            "out": {"w": jax.random.normal(k2, (self.hidden, 1)) / np.sqrt(self.hidden), "b": jnp.zeros(1)},
        }

    def loss(self, params, rng, batch, step: Step):
        h = jnp.tanh(batch["x"] @ params["hidden"]["w"] + params["hidden"]["b"])
        pred = (h @ params["out"]["w"] + params["out"]["b"])[:, 0]
        loss = jnp.mean((pred - batch["y"]) ** 2)
        if self.nan_at is not None:
            loss = jnp.where(step.index == self.nan_at, jnp.nan, loss)
        return loss, ({"mse_fit": loss}, Aux())


def empty_state(step: int = 0) -> TrainState:
    """A state at ``step`` holding no parameters (and a zero key): for a stage that reads none."""
    return TrainState(step=jnp.int32(step), params={}, opt_state=(), ema={}, rng=jnp.zeros(2, jnp.uint32))


def regression_batches(batch_size: int, num_batches: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=8).astype(np.float32)
    out = []
    for _ in range(num_batches):
        x = rng.normal(size=(batch_size, 8)).astype(np.float32)
        out.append({"x": x, "y": np.sin(x @ w).astype(np.float32)})
    return out


def trace_steps(directory) -> list[int]:
    """The step numbers of the ``train`` step annotations in the one Perfetto trace under
    ``directory`` (a ``pathlib.Path``), sorted."""
    import gzip
    import json

    (trace,) = list(directory.rglob("*.trace.json.gz"))
    with gzip.open(trace) as f:
        events = json.load(f)["traceEvents"]
    return sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train")
