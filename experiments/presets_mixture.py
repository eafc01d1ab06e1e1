"""Every preset trains: EDM, VP, VE and rectified flow on the 2D mixture, same MLP, same budget.

A plain loop over the pure pieces (``Diffusion.init``/``loss``/``generate`` + optax Adam 2e-3,
batch 256, ``--steps`` steps, no EMA), then Heun with 32 points on each preset's own σ schedule
and the sliced-Wasserstein ratio to the real-vs-real noise floor (3 sets of 1,000; floor from 20
pairs). A sanity table, not a ranking: each preset keeps its own paper hyper-parameters.

    PYTHONPATH=. .venv/bin/python experiments/presets_mixture.py
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dew
from dew.data.sources.mixture import RING
from dew.inputs import Field, InputSpec
from dew.objectives.base import Step
from dew.objectives.diffusion import Diffusion
from dew.scoring.sliced_wasserstein import ratio_to_noise_floor


def train_and_score(preset: str, steps: int, seed: int = 0) -> tuple[float, float]:
    """(SW ratio to the noise floor, final training loss) for ``preset``."""
    data = RING.sample(20_000, 0)
    model = functools.partial(dew.models["mlp"], width=128, blocks=3)
    objective = Diffusion(InputSpec(Field("x", (2,))), dew.presets[preset], model, {})
    params = objective.init(jax.random.PRNGKey(seed), {"x": data[:256]})
    optimizer = optax.adam(2e-3)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, rng, batch):
        def loss(p):
            return objective.loss(p, rng, {"x": batch}, Step(jnp.int32(0)))[0]

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    order = np.random.default_rng(seed)
    value = jnp.nan
    for i in range(steps):
        batch = data[order.integers(0, len(data), 256)]
        params, opt_state, value = step(params, opt_state, jax.random.PRNGKey(i), batch)
    draw = jax.jit(lambda rng: objective.generate(params, rng, {}, steps=32, num_samples=1000))
    _, _, ratio = ratio_to_noise_floor(
        lambda k: np.asarray(draw(jax.random.PRNGKey(k))), lambda k: RING.sample(1000, 1000 + k), sets=3
    )
    return ratio, float(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    print(f"| preset | target | SW ratio to floor ({args.steps} steps) | wall s |\n|---|---|---|---|")
    for preset in ("EDM", "VP", "VE", "RectifiedFlow"):
        start = time.perf_counter()
        ratio, _ = train_and_score(preset, args.steps)
        target = dew.presets[preset].target
        print(f"| {preset} | {target} | {ratio:.2f} | {time.perf_counter() - start:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
