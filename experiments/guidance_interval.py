"""Guidance in a limited interval (Kynkäänniemi et al. 2024) against full-range CFG, on
class-conditional digits, in a feature-space Fréchet distance.

Trains (once; a later call reuses the checkpoint) a short class-conditional EDM run of
``experiments/edm.py`` with condition dropout 0.1, then samples the debiased EMA from the same
noise with, for each guidance weight w: full-range CFG (σ ∈ (0, ∞)) and CFG limited to
σ ∈ (sigma_lo, sigma_hi] (EDM2's interval for ImageNet-512 by default, not tuned here). Scores:
the Fréchet distance to all 1,797 real digits in the 64-unit penultimate layer of a small MLP
classifier trained on the real training digits (``dew/scoring/digits_features.py``), and the
independent RBF-SVM's agreement with the requested class (``dew/scoring/digits_classifier.py``).

    PYTHONPATH=. .venv/bin/python experiments/guidance_interval.py --workdir=runs/guidance_digits
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dew.config import apply_overrides, load_config
from dew.sampling import CFG, nfe
from dew.scoring.digits_classifier import classify_digits
from dew.scoring.digits_features import classifier_accuracy_on_real_validation, digits_frechet_distance
from dew.training.trainer import Trainer

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/guidance_digits")
    parser.add_argument("--train_steps", type=int, default=1500)
    parser.add_argument("--weights", default="2,3,4")
    parser.add_argument("--sigma_lo", type=float, default=0.28)
    parser.add_argument("--sigma_hi", type=float, default=2.9)
    parser.add_argument("--per_class", type=int, default=100)
    parser.add_argument("--points", type=int, default=18)
    parser.add_argument("--seeds", type=int, default=2, help="independent sample sets per setting")
    args = parser.parse_args()

    config = apply_overrides(
        load_config(str(HERE / "edm.py")),
        [
            f"config.train.num_steps={args.train_steps}",
            "config.objective.condition_dropout=0.1",  # CFG needs the unconditional branch trained
            "config.eval.every=0",
            "config.preview.every=0",
            f"config.checkpoint.every={args.train_steps}",
        ],
    )
    trainer = Trainer(config, args.workdir)
    start = time.perf_counter()
    state = trainer.run()
    print(
        f"model: step {int(state.step)} ({time.perf_counter() - start:.0f} s incl. compiles), {args.workdir}"
    )
    params = trainer.debiased_ema(state)
    objective = trainer.objective
    labels = jnp.repeat(jnp.arange(10, dtype=jnp.int32), args.per_class)

    @jax.jit
    def draw(rng, weight, lo, hi):
        # The interval is traced, so every setting shares one compiled sampler.
        guidance = CFG(weight=weight, sigma_lo=lo, sigma_hi=hi)
        return objective.generate(params, rng, {"label": labels}, steps=args.points, guidance=guidance)

    print(
        "feature classifier accuracy on the 180 real validation digits: "
        f"{classifier_accuracy_on_real_validation():.1%}"
    )
    print(
        f"sampler: heun, {args.points} points = {nfe('heun', args.points)} NFE "
        "(x2 inside the guidance interval)"
    )
    print(f"{'w':>4} | {'interval':>14} | {'FD':>7} | {'class acc':>9}")
    rows = [(1.0, 0.0, np.inf)]
    for w in (float(x) for x in args.weights.split(",")):
        rows += [(w, 0.0, np.inf), (w, args.sigma_lo, args.sigma_hi)]
    for w, lo, hi in rows:
        fds, accs = [], []
        for seed in range(args.seeds):
            images = np.asarray(draw(jax.random.PRNGKey(seed), w, lo, hi))
            fds.append(digits_frechet_distance(images))
            accs.append(float(np.mean(classify_digits(np.clip(images, -1, 1)) == np.asarray(labels))))
        span = "full (0, inf)" if np.isinf(hi) else f"({lo}, {hi}]"
        print(
            f"{w:>4} | {span:>14} | {np.mean(fds):7.3f} | {np.mean(accs):9.1%}   "
            f"FD per seed {np.round(fds, 3).tolist()}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
