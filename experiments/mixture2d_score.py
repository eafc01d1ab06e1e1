"""Does a trained EDM reproduce the 2D mixture as well as fresh real samples do?

Trains ``experiments/mixture2d.py`` into ``--workdir`` (resuming or skipping if it is done),
then draws ``--n`` samples ``--sets`` times from the debiased EMA and measures the sliced
Wasserstein distance SW₂ (512 directions) of each set to an independent set of ``--n`` exact
draws from the mixture. The noise floor is SW₂ between two independent exact sets of the same
size (averaged over ``--floor_pairs`` pairs): what a perfect generator would score.
Reported: the ratio of the means (goal <= 1.25).

    PYTHONPATH=. .venv/bin/python experiments/mixture2d_score.py --workdir=runs/mixture2d
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import numpy as np

from dew.config import apply_overrides, load_config
from dew.data.sources.mixture import RING
from dew.sampling import nfe
from dew.scoring.sliced_wasserstein import ratio_to_noise_floor
from dew.training.trainer import Trainer

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/mixture2d")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--sets", type=int, default=5)
    parser.add_argument("--floor_pairs", type=int, default=20)
    parser.add_argument("--points", type=int, default=32)
    parser.add_argument("--solver", default="heun")
    parser.add_argument("overrides", nargs="*", help="config.a.b=value")
    args = parser.parse_args()

    config = apply_overrides(load_config(str(HERE / "mixture2d.py")), args.overrides)
    trainer = Trainer(config, args.workdir)
    start = time.perf_counter()
    state = trainer.run()
    print(f"trained to step {int(state.step)} in {time.perf_counter() - start:.0f} s (incl. compiles)")
    params = trainer.debiased_ema(state)

    draw = jax.jit(
        lambda rng: trainer.objective.generate(
            params, rng, {}, steps=args.points, solver=args.solver, num_samples=args.n
        )
    )
    model, floor, ratio = ratio_to_noise_floor(
        lambda k: np.asarray(draw(jax.random.PRNGKey(100 + k))),
        lambda k: RING.sample(args.n, 1000 + k),
        sets=args.sets,
        floor_pairs=args.floor_pairs,
    )
    print(
        f"{args.solver}, {args.points} points = {nfe(args.solver, args.points)} NFE, "
        f"{args.sets} model sets of {args.n}, floor from {args.floor_pairs} pairs of real sets"
    )
    print(f"SW2(model, real) = {model:.4f}")
    print(f"SW2(real, real)  = {floor:.4f}   (noise floor)")
    print(f"ratio = {ratio:.3f}  (goal <= 1.25)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
