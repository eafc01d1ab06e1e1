"""Post-hoc EMA (EDM2) on class-conditional digits: after one training run, reconstruct the EMA
for a sweep of σ_rel and score each in the digit feature space.

Trains (once; a later call reuses the run) ``experiments/edm.py`` with two power-EMA profiles
tracked in the step (σ_rel 0.05 and 0.10), snapshotted every ``--snapshot_every`` steps. Then, for
every σ_rel in ``--sigma_rels``, reconstructs the EMA at the last step by the least-squares
solution (``dew.averaging.posthoc.reconstruct``), draws ``--per_class`` samples per class
(Heun, ``--points`` points, no guidance) from the same noise, and scores the Fréchet distance to all 1,797
real digits in the 64-unit feature space of ``dew/scoring/digits_features.py`` (through the
streaming statistics). The run's own fixed EMA (β = 0.999, debiased) and the two tracked profiles
is scored the same way; the two tracked profiles check the reconstruction in parameter space.
Writes a table (stdout, markdown) and a plot.

    PYTHONPATH=. /work/venv/bin/python experiments/phema_sweep.py --workdir=runs/phema_digits
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dew.averaging import posthoc as posthoc_ema
from dew.config import apply_overrides, load_config
from dew.scoring.digits_classifier import classify_digits
from dew.scoring.digits_features import digits_frechet_distance
from dew.training.trainer import Trainer, debiased_ema

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/phema_digits")
    parser.add_argument("--train_steps", type=int, default=1000)
    parser.add_argument("--snapshot_every", type=int, default=125)
    parser.add_argument("--sigma_rels", default="0.03,0.05,0.08,0.12,0.18,0.27")
    parser.add_argument("--per_class", type=int, default=50)
    parser.add_argument("--points", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=2, help="independent sample sets per setting")
    parser.add_argument("--plot", default=str(HERE / "phema_sweep.png"))
    args = parser.parse_args()

    config = apply_overrides(
        load_config(str(HERE / "edm.py")),
        [
            f"config.train.num_steps={args.train_steps}",
            "config.ema.power_std_rels=(0.05, 0.1)",
            f"config.ema.snapshot_every={args.snapshot_every}",
        ],
    )
    trainer = Trainer(config, args.workdir)
    start = time.perf_counter()
    state = trainer.run()
    print(
        f"model: step {int(state.step)} ({time.perf_counter() - start:.0f} s incl. compiles), {args.workdir}"
    )
    store = trainer.power_ema_snapshots()
    snapshots = store.snapshots()
    store.close()
    print(f"{len(snapshots)} snapshots at t = {sorted({s.t for s in snapshots})}")

    objective = trainer.objective
    labels = jnp.repeat(jnp.arange(10, dtype=jnp.int32), args.per_class)

    @jax.jit
    def draw(params, rng):
        return objective.generate(params, rng, {"label": labels}, steps=args.points)

    def score(params) -> tuple[list[float], list[float]]:
        params = jax.device_put(params)
        fds, accs = [], []
        for seed in range(args.seeds):
            images = np.clip(np.asarray(draw(params, jax.random.PRNGKey(seed))), -1, 1)
            fds.append(digits_frechet_distance(images))
            accs.append(float(np.mean(classify_digits(images) == np.asarray(labels))))
        return fds, accs

    rows = []
    fixed = score(debiased_ema(state, trainer.averages.ema.law_spec))
    rows.append({"what": "fixed EMA β=0.999 (the run's)", "sigma_rel": None, "fd": fixed[0], "acc": fixed[1]})

    # Reconstruction fidelity in parameter space: a tracked profile lies in the snapshots' span,
    # so its reconstruction should return it; the two tracked profiles' distance gives the scale.
    def flat(tree) -> np.ndarray:
        return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])

    power, slots = trainer.averages.power, state.power_ema
    assert power is not None and slots is not None, "the run tracks power-EMA profiles"
    tracked = {s: flat(jax.device_get(slot)) for s, slot in zip(power.std_rels, slots, strict=True)}
    a, b = tracked.values()
    print(f"‖θ̂(0.05) − θ̂(0.10)‖ / ‖θ̂(0.10)‖ = {np.linalg.norm(a - b) / np.linalg.norm(b):.3e}")
    for sigma, theta in tracked.items():
        recon = flat(posthoc_ema.reconstruct(snapshots, sigma))
        gap = np.linalg.norm(recon - theta) / np.linalg.norm(theta)
        print(f"reconstructed vs tracked σ_rel={sigma:.2f}: relative difference {gap:.3e}")
    sweep = []
    for sigma in (float(s) for s in args.sigma_rels.split(",")):
        fd, acc = score(posthoc_ema.reconstruct(snapshots, sigma))
        sweep.append({"what": f"reconstructed σ_rel={sigma:.3f}", "sigma_rel": sigma, "fd": fd, "acc": acc})
    rows += sweep

    print("\n| EMA | FD (mean of seeds) | FD per seed | class acc |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['what']} | {np.mean(r['fd']):.3f} | {', '.join(f'{x:.3f}' for x in r['fd'])} "
            f"| {np.mean(r['acc']):.1%} |"
        )
    best = min(sweep, key=lambda r: np.mean(r["fd"]))
    fixed_fd, best_fd = np.mean(rows[0]["fd"]), np.mean(best["fd"])
    print(
        f"\nbest reconstructed: σ_rel={best['sigma_rel']:.3f}, FD {best_fd:.3f} vs the fixed EMA's "
        f"{fixed_fd:.3f} ({(best_fd - fixed_fd) / fixed_fd:+.1%})"
    )
    with open(os.path.join(args.workdir, "phema_sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    xs = [r["sigma_rel"] for r in sweep]
    means = [np.mean(r["fd"]) for r in sweep]
    lo = [np.mean(r["fd"]) - np.min(r["fd"]) for r in sweep]
    hi = [np.max(r["fd"]) - np.mean(r["fd"]) for r in sweep]
    ax.errorbar(xs, means, yerr=[lo, hi], marker="o", capsize=3, label="reconstructed (post hoc)")
    ax.axhline(fixed_fd, color="C3", ls="--", label="run's fixed EMA (β=0.999)")
    ax.set_xlabel("σ_rel of the EMA profile")
    ax.set_ylabel(f"digit-feature FD ({args.seeds} seeds × {10 * args.per_class})")
    ax.set_title(f"Post-hoc EMA on digits, step {int(state.step)}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.plot)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
