"""Are class-conditional samples really digits of the requested class?

Restores the debiased EMA of a run's latest checkpoint, draws ``--per_class`` samples of every
class, and asks an independent classifier (an RBF SVM fitted on all 1,797 real digits; see
``dew/scoring/digits_classifier.py``) what each shows.

    .venv/bin/python experiments/digits_accuracy.py --workdir=runs/edm --per_class=100
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import cast

import jax
import ml_collections
import numpy as np

from dew.artifacts import ImageGrid
from dew.checkpointing import read_run_metadata
from dew.objectives.diffusion import Diffusion
from dew.scoring.digits_classifier import classify_digits
from dew.tracking.trackers import write_png
from dew.training.trainer import Trainer


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/edm")
    parser.add_argument("--per_class", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="sampler points (default: the run's config)")
    args = parser.parse_args()

    metadata = read_run_metadata(args.workdir)
    if metadata is None:
        print(f"error: {args.workdir} has no run.json; train first (make train)", file=sys.stderr)
        return 2
    config = ml_collections.ConfigDict(metadata["config"])
    trainer = Trainer(config, args.workdir)
    checkpoints = trainer.checkpoints
    assert checkpoints is not None, "the run keeps checkpoints"
    objective = cast(Diffusion, trainer.objective)  # the run digits_accuracy reads: a diffusion run
    step = checkpoints.latest_step()
    if step is None:
        print(f"error: no checkpoint in {checkpoints.directory}", file=sys.stderr)
        return 2
    template = jax.eval_shape(trainer.programs.init, jax.random.PRNGKey(0), trainer.example_batch()).params
    params = checkpoints.restore_ema(template, step)  # debiased as the checkpoint records
    sampling = objective.sampling
    steps = args.steps or sampling.steps

    @jax.jit
    def draw(rng):
        return objective.draw(
            params,
            rng,
            per_class=args.per_class,
            steps=steps,
            solver=sampling.solver,
            guidance=sampling.guidance,
            # Sampling refuses an interval that is not () or a pair (diffusion_config._interval_ok).
            guidance_interval=sampling.guidance_interval,  # pyright: ignore[reportArgumentType]
        )

    images, labels = jax.device_get(draw(jax.random.PRNGKey(args.seed)))
    predicted = classify_digits(np.clip(images, -1, 1))
    accuracy = float(np.mean(predicted == labels))
    per_class = [float(np.mean(predicted[labels == c] == c)) for c in range(10)]
    print(
        f"checkpoint step {step}: {len(labels)} samples ({args.per_class} per class), "
        f"{sampling.solver} with {steps} points"
    )
    print(f"classifier agrees with the requested class on {accuracy:.1%}")
    print("per class: " + "  ".join(f"{c}:{a:.0%}" for c, a in enumerate(per_class)))
    show = np.concatenate([images[labels == c][:10] for c in range(10)])
    path = write_png(
        os.path.join(args.workdir, "previews", f"accuracy_grid_{step:08d}.png"),
        ImageGrid(np.clip(show, -1, 1), columns=10),
    )
    print(f"grid of the first 10 per class: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
