"""Write ``tests/data/checkpoint_729b5ab``: a tiny checkpoint written by the code of commit 729b5ab
(OCDBT items, a raw ``uint32[2]`` PRNG key, an EMA law in ``extra``, a data position, metrics), to
prove that later formats and key handling still restore it.

Run from a checkout of that commit:  PYTHONPATH=. python <this file> <output directory>
The state is ``tiny_state(3)`` below, saved at step 3 with the position ``{"epoch": 0, "batch": 3}``
of share 0 of 1 and the metric ``loss=0.25``; the EMA's law is a constant decay of 0.9.
"""

import json
import sys

import jax
import jax.numpy as jnp
import optax

from dew.checkpointing import Checkpoints
from dew.data.dataset import DataPartition
from dew.training.state import TrainState


def tiny_state(step: int) -> TrainState:
    params = {"w": jnp.arange(6.0).reshape(2, 3) + step, "b": jnp.arange(3.0) - step}
    opt_state = jax.tree.map(
        lambda x: x + 0.5 if x.dtype == jnp.float32 else x, optax.adam(1e-3).init(params)
    )
    return TrainState(
        step=jnp.int32(step),
        params=params,
        opt_state=opt_state,
        ema=jax.tree.map(lambda x: 0.25 * x, params),
        rng=jax.random.PRNGKey(7),
    )


if __name__ == "__main__":
    ema = {"decay": 0.9, "half_life": None, "ramp_up": None, "tracked": None, "accumulation": 1}
    ckpt = Checkpoints(sys.argv[1], keep=None, asynchronous=False, ema=ema)
    position = json.dumps({"epoch": 0, "batch": 3}).encode()
    ckpt.save(3, tiny_state(3), position, {"loss": 0.25}, share=DataPartition(0, 1))
    ckpt.close()
