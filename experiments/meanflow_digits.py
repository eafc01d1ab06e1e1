"""MeanFlow against EDM on the digits at 1, 2 and 35 network evaluations (NFE).

Scores two finished runs on the embedded 8x8 digits: a MeanFlow run of ``experiments/meanflow.py``
(the ``digits`` preset: dew's U-Net given MeanFlow's second time input h) and an EDM run of
``experiments/edm.py``. Each run's debiased EMA of its latest checkpoint draws ``--per_class``
samples of every class from the same seed:

* MeanFlow at 1 NFE (schedule t = 1 -> 0) and 2 NFE (1 -> 0.5 -> 0);
* EDM at 1 NFE (one denoiser call at σ_max: D(σ_max z; σ_max), an Euler step from σ_max to 0; the
  sampler itself needs two σ points), 2 NFE (Euler, 2 points: σ_max -> σ_min, then D at σ_min;
  and Euler σ_max -> σ_mid ≈ 2.5, the middle of EDM's 3-point schedule, then D there) and
  35 NFE (Heun, 18 points, the EDM default).

Scores: the independent RBF-SVM's agreement with the requested class
(``dew/scoring/digits_classifier.py``) and the Fréchet distance to all 1,797 real digits in the
64-unit feature layer of ``dew/scoring/digits_features.py`` (``digits_frechet_distance``). Writes
one grid per row (10 samples of each class, one class per row) under ``--pictures``.

    PYTHONPATH=. .venv/bin/python experiments/meanflow_digits.py --meanflow=runs/mf --edm=runs/edm
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import cast

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dew.artifacts import ImageGrid
from dew.checkpointing import read_run_metadata
from dew.objectives.diffusion import Diffusion
from dew.objectives.meanflow import MeanFlow
from dew.sampling import nfe, sample
from dew.scoring.digits_classifier import classify_digits
from dew.scoring.digits_features import digits_frechet_distance
from dew.tracking.trackers import write_png
from dew.training.trainer import Trainer

MEANFLOW_SCHEDULES = {1: (1.0, 0.0), 2: (1.0, 0.5, 0.0)}
EDM_SETTINGS = {1: None, 2: ("euler", 2), "2 (σ_mid)": None, 35: ("heun", 18)}


def one_evaluation(objective, params, rng, per_class: int):
    """EDM at 1 NFE (the sampler needs two σ points): the denoiser's prediction at σ_max from the
    noise ``generate`` would draw from ``rng``, i.e. one Euler step from σ_max to σ = 0."""
    labels = jnp.repeat(jnp.arange(objective.num_classes, dtype=jnp.int32), per_class)
    noise = jax.random.normal(rng, (labels.shape[0], *objective.input_spec.sample.shape), jnp.float32)
    sigma_max = objective.process.sigmas(2)[0]
    return objective.denoiser(params, {"label": labels})(noise * sigma_max, sigma_max), labels


def two_evaluations_mid(objective, params, rng, per_class: int):
    """EDM at 2 NFE with an intermediate stop: Euler from σ_max to the middle point of the 3-point
    EDM schedule (ρ = 7: σ ≈ 2.5), then the denoiser's prediction there (the 3-point schedule with its
    σ_min evaluation dropped). EDM's own 2-point schedule (σ_max, σ_min) goes from σ_max to 0.002 in
    one Euler step, which is the 1-NFE prediction again."""
    labels = jnp.repeat(jnp.arange(objective.num_classes, dtype=jnp.int32), per_class)
    noise = jax.random.normal(rng, (labels.shape[0], *objective.input_spec.sample.shape), jnp.float32)
    sigmas = objective.process.sigmas(3)[:2]
    return sample(objective.denoiser(params, {"label": labels}), noise, sigmas, "euler"), labels


def restore(workdir: str):
    """(trainer, debiased EMA parameters, step) of ``workdir``'s latest checkpoint."""
    metadata = read_run_metadata(workdir)
    if metadata is None:
        raise SystemExit(f"error: {workdir} has no run.json; train first")
    trainer = Trainer(ml_collections.ConfigDict(metadata["config"]), workdir)
    checkpoints = trainer.checkpoints
    assert checkpoints is not None, "the run keeps checkpoints"
    step = checkpoints.latest_step()
    if step is None:
        raise SystemExit(f"error: no checkpoint in {checkpoints.directory}")
    template = jax.eval_shape(trainer.programs.init, jax.random.PRNGKey(0), trainer.example_batch()).params
    return trainer, checkpoints.restore_ema(template, step), step


def score(name: str, images: np.ndarray, labels: np.ndarray, pictures: str) -> tuple[float, float]:
    images = np.clip(np.nan_to_num(np.asarray(images), nan=0.0), -1.0, 1.0)
    labels = np.asarray(labels)
    accuracy = float(np.mean(classify_digits(images) == labels))
    distance = float(digits_frechet_distance(images))
    grid = np.concatenate([images[labels == c][:10] for c in range(10)])
    write_png(os.path.join(pictures, f"{name}.png"), ImageGrid(grid, columns=10))
    return accuracy, distance


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--meanflow", required=True, help="workdir of an experiments/meanflow.py digits run")
    parser.add_argument("--edm", required=True, help="workdir of an experiments/edm.py run")
    parser.add_argument("--per_class", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pictures", default=os.path.join(os.path.dirname(__file__), "pictures"))
    parser.add_argument("--prefix", default="meanflow_digits")
    args = parser.parse_args()

    rows = []
    trainer, params, step = restore(args.meanflow)
    labels = np.repeat(np.arange(10), args.per_class)
    for evaluations, schedule in MEANFLOW_SCHEDULES.items():
        draw = jax.jit(
            lambda p, r, s=schedule: cast(MeanFlow, trainer.objective).draw(
                p, r, per_class=args.per_class, schedule=s
            )
        )
        images = jax.device_get(draw(params, jax.random.PRNGKey(args.seed)))
        name = f"{args.prefix}_meanflow_{evaluations}nfe"
        rows.append(
            ("MeanFlow", step, evaluations, str(schedule), *score(name, images, labels, args.pictures))
        )

    trainer, params, step = restore(args.edm)
    for evaluations, setting in EDM_SETTINGS.items():
        if setting is None:  # one denoiser call at σ_max, or Euler to σ_mid then D there
            function = one_evaluation if evaluations == 1 else two_evaluations_mid
            images, drawn = jax.device_get(
                jax.jit(function, static_argnums=(0, 3))(
                    trainer.objective, params, jax.random.PRNGKey(args.seed), args.per_class
                )
            )
            sigmas = np.asarray(cast(Diffusion, trainer.objective).process.sigmas(3))
            sampler = (
                "D(σ_max z; σ_max)" if evaluations == 1 else f"euler, σ {sigmas[0]:.0f} -> {sigmas[1]:.2f}"
            )
        else:
            solver, points = setting
            assert nfe(solver, points) == evaluations, (solver, points)

            def draw(p, r, solver=solver, points=points):
                return cast(Diffusion, trainer.objective).draw(
                    p, r, per_class=args.per_class, steps=points, solver=solver
                )

            images, drawn = jax.device_get(jax.jit(draw)(params, jax.random.PRNGKey(args.seed)))
            sampler = f"{solver}, {points} points"
        name = f"{args.prefix}_edm_{str(evaluations).split()[0]}nfe" + (
            "_mid" if "mid" in str(evaluations) else ""
        )
        rows.append(("EDM", step, evaluations, sampler, *score(name, images, drawn, args.pictures)))

    print("| model | training steps | NFE | sampler | class accuracy | Fréchet distance |")
    print("|---|---:|---:|---|---:|---:|")
    for model, step, evaluations, sampler, accuracy, distance in rows:
        print(f"| {model} | {step} | {evaluations} | {sampler} | {accuracy:.1%} | {distance:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
