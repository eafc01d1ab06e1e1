"""REPA against no REPA on the 8×8 digits: export the contrastive encoder, then score runs.

    python -m dew.main --config=experiments/probe.py --workdir=runs/probe
    PYTHONPATH=. python experiments/repa_digits.py export --probe=runs/probe --out=runs/probe-encoder.npz
    timeout -s INT 480 python -m dew.main --config=experiments/repa.py:digits --workdir=runs/repa \
        --config.objective.repa.encoder_weights=runs/probe-encoder.npz
    timeout -s INT 480 python -m dew.main --config=experiments/repa.py:digits-baseline --workdir=runs/sit
    PYTHONPATH=. python experiments/repa_digits.py score --runs runs/repa runs/sit \
        --picture=experiments/pictures/repa_digits.png

``export`` writes the debiased-EMA ``image_encoder`` parameters of a contrastive run
(``experiments/probe.py``) in the layout ``config.objective.repa.encoder_weights`` reads
(``dew.objectives.repa_encoders.export_image_encoder``: content digest included).

``score`` restores each run's latest checkpoint (its debiased EMA, as
``experiments/digits_accuracy.py`` does), draws
``--per_class`` samples of every class with the run's own preview sampler from the same noise
seed, and reports the independent digit classifier's agreement with the requested class
(``digits_class_accuracy``) and the Fréchet distance to the 1,797 real digits in that
classifier's feature space (``digits_frechet_distance``), one JSON line per run; ``--picture``
puts the first 10 samples per class of each run side by side (one row per class).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import cast

import numpy as np


def export(args: argparse.Namespace) -> int:
    from dew.inference import pipeline
    from dew.objectives.repa_encoders import export_image_encoder

    task = pipeline(args.probe)
    digest = export_image_encoder(task.params, args.out)
    print(json.dumps({"probe": args.probe, "step": task.step, "out": args.out, "content_sha256": digest}))
    return 0


def score(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp
    import ml_collections

    from dew.checkpointing import read_run_metadata
    from dew.objectives.interpolant import Interpolant
    from dew.scoring.digits_classifier import digits_class_accuracy
    from dew.scoring.digits_features import digits_frechet_distance
    from dew.training.trainer import Trainer

    panels = []
    for workdir in args.runs:
        metadata = read_run_metadata(workdir)
        if metadata is None:
            print(f"error: {workdir} has no run.json", file=sys.stderr)
            return 2
        trainer = Trainer(ml_collections.ConfigDict(metadata["config"]), workdir)
        checkpoints = trainer.checkpoints
        assert checkpoints is not None, "the run keeps checkpoints"
        step = checkpoints.latest_step()
        init = trainer.programs.init
        template = jax.eval_shape(init, jax.random.PRNGKey(0), trainer.example_batch()).params
        params = checkpoints.restore_ema(template, step)  # debiased, as the checkpoint records
        objective = cast(Interpolant, trainer.objective)  # a REPA run: the interpolant objective
        labels = jnp.repeat(jnp.arange(10, dtype=jnp.int32), args.per_class)
        images = jax.jit(objective.generate)(params, jax.random.PRNGKey(args.seed), labels)
        images = np.clip(np.asarray(images, np.float32), -1, 1)
        labels = np.asarray(labels)
        row = {
            "run": workdir,
            "step": step,
            "samples": len(labels),
            "sampler": type(objective.sampler).__name__,
            "sampler_method": getattr(objective.sampler, "method", None),
            "sampler_steps": objective.sampler.num_steps,
            "digits_class_accuracy": digits_class_accuracy(images, labels),
            "digits_frechet_distance": digits_frechet_distance(images),
        }
        print(json.dumps(row))
        panels.append(np.concatenate([images[labels == c][:10] for c in range(10)]))
    if args.picture:
        write_side_by_side(panels, args.picture)
        print(f"picture: {args.picture}")
    return 0


def write_side_by_side(panels: list[np.ndarray], path: str, scale: int = 4) -> None:
    """Each panel [100, 8, 8, 1] as a 10×10 grid (one row per class), panels left to right with
    a white gap, pixels enlarged ``scale`` times."""
    from PIL import Image

    grids = []
    for images in panels:
        tiles = ((images[..., 0] + 1) * 127.5).round().clip(0, 255).astype(np.uint8)
        rows = [
            np.concatenate(list(np.pad(tiles[r * 10 : (r + 1) * 10], ((0, 0), (1, 1), (1, 1)))), 1)
            for r in range(10)
        ]
        grids.append(np.concatenate(rows, 0))
    gap = np.full((grids[0].shape[0], 6), 255, np.uint8)
    picture = np.concatenate([x for g in grids for x in (g, gap)][:-1], axis=1)
    Image.fromarray(picture).resize(
        (picture.shape[1] * scale, picture.shape[0] * scale), Image.Resampling.NEAREST
    ).save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    e = commands.add_parser("export", help="write a contrastive run's image_encoder weights")
    e.add_argument("--probe", required=True, help="the contrastive run's workdir")
    e.add_argument("--out", required=True, help="the .npz to write")
    s = commands.add_parser("score", help="sample and score runs")
    s.add_argument("--runs", nargs="+", required=True)
    s.add_argument("--per_class", type=int, default=100)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--picture", default=None)
    args = parser.parse_args(argv)
    return export(args) if args.command == "export" else score(args)


if __name__ == "__main__":
    sys.exit(main())
