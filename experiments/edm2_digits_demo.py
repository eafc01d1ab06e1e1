"""EDM2 against the SongUNet on the embedded digits at equal wall time, then the guidance modes
of the EDM2 run at equal sampler steps.

``train``: ``python -m dew.main`` on ``experiments/edm2.py:digits`` and on ``experiments/edm.py``
(the SongUNet), one after the other, each stopped by SIGTERM after ``--budget`` seconds of wall
time counted from its process start (so build, compilation and start-up are inside the budget);
dew.main's preemption handler saves a checkpoint at the step in flight. Both train with condition
dropout 0.1 (the unconditional branch CFG needs: dew's CFG guides a network against its own
null-label prediction; it has no separate unconditional network) and without evaluation or
previews, checkpointing every ``--every`` steps (kept, so an earlier checkpoint can guide).

``score``: through ``dew.pipeline`` (debiased EMA of the latest checkpoint), the same noise and
labels for every mode (``--per_class`` per class, ``--seeds`` sets), Heun with ``--points`` σ
points: the SongUNet and EDM2 unguided, and EDM2 with CFG over every σ, CFG in
σ ∈ (``--sigma_lo``, ``--sigma_hi``], and autoguidance (guide: the EDM2 run's own checkpoint
nearest ``--guide_fraction`` of its steps, its debiased EMA) over every σ. Scores: the
independent RBF-SVM's agreement with the requested class (``dew.scoring.digits_classifier``)
and the Fréchet distance in the digit classifier's features (``dew.scoring.digits_features``).
``--main``/``--guide`` name other sources for the EDM2 network and its guide (e.g. the run
directories ``python -m dew.phema`` writes: a post-hoc EMA reconstruction). Writes
``<out>/<--record>.json`` and one picture: two rows per mode (SongUNet, EDM2, CFG, interval CFG,
autoguidance), one column per requested class.

    PYTHONPATH=. python experiments/edm2_digits_demo.py train --out=runs/edm2_demo --budget=270
    PYTHONPATH=. python experiments/edm2_digits_demo.py score --out=runs/edm2_demo
    python -m dew.phema --workdir=runs/edm2_demo/edm2 --sigma_rel=0.05 --step=300
    PYTHONPATH=. python experiments/edm2_digits_demo.py score --out=runs/edm2_demo \
        --main=runs/edm2_demo/edm2/phema/sigma_rel_0.050 --record=score_phema
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
RUNS = {
    "edm2": f"--config={HERE / 'edm2.py'}:digits",
    "songunet": f"--config={HERE / 'edm.py'}",
}


def train(args: argparse.Namespace) -> dict:
    """Each run for ``args.budget`` seconds of wall time, one after the other."""
    record = {}
    for name, config in RUNS.items():
        workdir = os.path.join(args.out, name)
        command = [
            sys.executable,
            "-m",
            "dew.main",
            config,
            f"--workdir={workdir}",
            "--config.objective.condition_dropout=0.1",
            "--config.train.num_steps=1000000",
            f"--config.checkpoint.every={args.every}",
            "--config.checkpoint.keep=1000",
            "--config.eval.every=0",
            "--config.preview.every=0",
            f"--config.train.log_every={args.every}",
        ]
        if name == "edm2":
            command.append(f"--config.ema.snapshot_every={args.every}")
        load_before = os.getloadavg()
        start = time.perf_counter()
        process = subprocess.Popen(command)
        try:
            process.wait(timeout=args.budget)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # dew.main saves the step in flight and exits
            process.wait()
        wall = time.perf_counter() - start
        steps = _latest_step(workdir)
        record[name] = {
            "command": " ".join(command[1:]),
            "budget_s": args.budget,
            "wall_s_incl_final_save": round(wall, 1),
            "steps": steps,
            "returncode": process.returncode,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        }
        print(json.dumps({name: record[name]}), flush=True)
    return record


def _latest_step(workdir: str) -> int | None:
    directory = os.path.join(workdir, "checkpoints")
    steps = [int(d) for d in os.listdir(directory) if d.isdigit()] if os.path.isdir(directory) else []
    return max(steps) if steps else None


def score(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dew.artifacts import ImageGrid
    from dew.inference import pipeline
    from dew.sampling import CFG, nfe
    from dew.scoring.digits_classifier import classify_digits
    from dew.scoring.digits_features import digits_frechet_distance
    from dew.tracking.media import write_png

    main = pipeline(args.main or os.path.join(args.out, "edm2"))
    if args.guide:
        guide = pipeline(args.guide)
    else:
        checkpoints = os.path.join(args.out, "edm2", "checkpoints")
        steps = sorted(int(d) for d in os.listdir(checkpoints) if d.isdigit())
        nearest = min(steps, key=lambda s: abs(s - args.guide_fraction * main.step))
        guide = pipeline(os.path.join(checkpoints, str(nearest)))
    guide_step = guide.step
    song = pipeline(os.path.join(args.out, "songunet"))
    labels = jnp.repeat(jnp.arange(10, dtype=jnp.int32), args.per_class)
    conditions = {"label": labels}

    def sampler(task, kind):
        """One jitted sampler per kind; the weight and interval are traced."""
        objective = task.objective

        @jax.jit
        def draw(params, rng, weight, lo, hi, guide_params):
            guidance = None if kind == "none" else CFG(weight=weight, sigma_lo=lo, sigma_hi=hi)
            extra = {"guide": guide.objective, "guide_params": guide_params} if kind == "auto" else {}
            return objective.generate(
                params, rng, conditions, steps=args.points, solver="heun", guidance=guidance, **extra
            )

        return draw

    w, lo, hi = args.weight, args.sigma_lo, args.sigma_hi
    modes = [  # name, task, kind, weight, interval
        ("SongUNet, no guidance", song, "none", 1.0, (0.0, np.inf)),
        ("EDM2, no guidance", main, "none", 1.0, (0.0, np.inf)),
        (f"EDM2, CFG w={w}", main, "cfg", w, (0.0, np.inf)),
        (f"EDM2, interval CFG w={w} in ({lo}, {hi}]", main, "cfg", w, (lo, hi)),
        (f"EDM2, autoguidance w={w} (guide: step {guide_step})", main, "auto", w, (0.0, np.inf)),
    ]
    samplers, rows, picture = {}, [], []
    truth = np.asarray(labels)
    for name, task, kind, weight, (a, b) in modes:
        key = (id(task), kind)
        if key not in samplers:
            samplers[key] = sampler(task, kind)
        accs, fds = [], []
        began = time.perf_counter()
        for seed in range(args.seeds):
            images = np.asarray(
                samplers[key](task.params, jax.random.PRNGKey(seed), weight, a, b, guide.params)
            )
            images = np.clip(images, -1, 1)
            accs.append(float(np.mean(classify_digits(images) == truth)))
            fds.append(float(digits_frechet_distance(images)))
            if seed == 0:  # the first 2 per class, one row of 10 classes each
                picture.append(np.stack([images[truth == c][:2] for c in range(10)], 1).reshape(-1, 8, 8, 1))
        n = args.per_class * 10 * args.seeds
        acc = float(np.mean(accs))
        row = {
            "mode": name,
            "network_evaluations_per_step_inside_interval": 1 if kind == "none" else 2,
            "accuracy": acc,
            "accuracy_se": float(np.sqrt(acc * (1 - acc) / n)),
            "fd_mean": float(np.mean(fds)),
            "fd_per_seed": [round(f, 4) for f in fds],
            "samples": n,
            "wall_s_incl_compile": round(time.perf_counter() - began, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    record = {
        "edm2": main.workdir,
        "edm2_step": main.step,
        "guide": guide.workdir,
        "songunet_step": song.step,
        "guide_step": guide_step,
        "sampler": f"heun, {args.points} points = {nfe('heun', args.points)} steps of the ODE",
        "per_class": args.per_class,
        "seeds": args.seeds,
        "rows": rows,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    grid = ImageGrid(np.concatenate(picture), columns=10)
    record["picture"] = write_png(args.picture, grid)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("phase", choices=("train", "score"))
    parser.add_argument("--out", default="runs/edm2_demo")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds of wall time per run")
    parser.add_argument("--every", type=int, default=50, help="checkpoint (and power-EMA snapshot) steps")
    parser.add_argument("--per_class", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--points", type=int, default=18)
    parser.add_argument("--weight", type=float, default=2.0)
    parser.add_argument("--sigma_lo", type=float, default=0.28)
    parser.add_argument("--sigma_hi", type=float, default=2.9)
    parser.add_argument("--guide_fraction", type=float, default=0.5)
    parser.add_argument("--main", default=None, help="EDM2 source to score (default <out>/edm2)")
    parser.add_argument(
        "--guide",
        default=None,
        help="guide source (default: the <out>/edm2 checkpoint nearest --guide_fraction of its steps)",
    )
    parser.add_argument("--record", default="score", help="<out>/<record>.json for the score phase")
    parser.add_argument("--picture", default=str(HERE / "pictures" / "edm2_digits_guidance.png"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    record = train(args) if args.phase == "train" else score(args)
    name = args.phase if args.phase == "train" else args.record
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
