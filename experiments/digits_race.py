"""Equal wall-clock quality: train ``experiments/edm.py`` for a fixed time budget, then score.

The clock starts before anything is built, so the budget (default 240 s) includes building the
trainer, compiling and initialising; training steps run until it is spent (the step in flight
finishes), each dispatched before the previous one is waited for, as ``fit`` runs them. Then
200 class-conditional samples (20 per class, Heun with 18 points = 35 NFE, no guidance) are
drawn from the debiased EMA and from the raw weights, by dew's sampler (``Diffusion.denoiser``
and ``dew.sampling.sample``), once for each of ``--sample_seeds`` (default 1,2,3), and the
independent digit classifier (an RBF SVM on all 1,797 real digits,
``dew/scoring/digits_classifier.py``) says how many show the class asked for. The starting
noise and labels of each seed come from ``experiments/race_latents.py`` (one
``np.random.default_rng(seed)`` draw, class-major labels), which the reference's race
(``third_party/edm/digits_race_reference.py``) draws from too: for the same seeds both sides
sample the very same latents, so the race's accuracies differ by what was trained, not by two
noise draws. ``accuracy_ema`` / ``accuracy_raw`` are the means over the seeds,
``accuracy_ema_seeds`` / ``accuracy_raw_seeds`` each seed's; the first seed's sets are saved as
``samples_ema.png`` / ``samples_raw.png`` in the workdir, one row per class. Everything else is
``experiments/edm.py``'s defaults, run as ``python -m dew.main`` runs it (each batch split over
one CPU device per core); the batch size is the race's (128, as in the reference's race).

``--path=custom`` runs the same race as a user's own loop written as the API reference shows it:
``Trainer(config, workdir)`` and a loop over ``trainer.step``, with no ``dew.runtime.start`` call
and no restart with glibc's malloc tunables, so what the Trainer applies by itself is what is measured.

    PYTHONPATH=. python experiments/digits_race.py --workdir=runs/digits_race [--budget=240] [--path=custom]

``--max_steps=N`` also stops after N steps (an equal-steps comparison on a loaded machine).
``--params_out=<npz>`` also keeps the two networks sampled, as ``ema/<module>/<name>`` and
``raw/<module>/<name>`` arrays (haiku's parameter paths), for ``experiments/race_cross_sampling.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import time
from types import ModuleType
from typing import Any, cast

HERE = pathlib.Path(__file__).resolve().parent


def process_age() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere 0), so that the clock includes
    the interpreter's start and the restart below."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


def load_race_latents() -> ModuleType:
    """``experiments/race_latents.py`` (the shared sampling noise), loaded by path."""
    spec = importlib.util.spec_from_file_location("race_latents", HERE / "race_latents.py")
    assert spec is not None and spec.loader is not None  # a .py file next to this one
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    custom = "--path=custom" in sys.argv[1:]
    if not custom:
        from dew.runtime.cpu.memory import with_kept_heap

        with_kept_heap()  # as python -m dew.main does: restarts this process once (same process id)
    start = time.perf_counter() - process_age()
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--path",
        choices=("cli", "custom"),
        default="cli",
        help="cli: as python -m dew.main starts; custom: Trainer(config, workdir) in a user's loop",
    )
    parser.add_argument("--workdir", default="runs/digits_race")
    parser.add_argument("--budget", type=float, default=240.0, help="seconds, including build and compile")
    parser.add_argument(
        "--max_steps", type=int, default=0, help="also stop after this many steps (0: the budget alone)"
    )
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--per_class", type=int, default=20)
    parser.add_argument("--points", type=int, default=18)
    parser.add_argument(
        "--sample_seeds",
        default="1,2,3",
        help="seeds of the shared sampling noise (experiments/race_latents.py), comma-separated",
    )
    parser.add_argument("--params_out", help="also write the EMA and raw parameters sampled (.npz)")
    parser.add_argument("overrides", nargs="*", help="config.<key>=<value> (recorded in the result)")
    args = parser.parse_args()
    shared = load_race_latents()
    try:
        sample_seeds = shared.parse_seeds(args.sample_seeds)
    except ValueError as error:
        parser.error(str(error))

    import jax
    import numpy as np

    from dew.artifacts import ImageGrid
    from dew.config import load_config
    from dew.runtime.platform import start as start_runtime
    from dew.sampling import sample
    from dew.scoring.digits_classifier import classify_digits
    from dew.tracking.media import write_png
    from dew.training.trainer import Trainer, resolve_config

    config = resolve_config(
        load_config(str(HERE / "edm.py")),
        # eval.num_batches: the 180 validation digits hold one batch of 128 (the race does not evaluate).
        [
            f"config.dataset.batch_size={args.batch_size}",
            "config.eval.num_batches=1",
            *args.overrides,
        ],
    )
    if args.path == "custom":  # the Trainer applies the platform's choices itself
        trainer = Trainer(config, args.workdir)
        from dew.runtime.platform import started

        convolutions = getattr(started(), "convolutions", None)
        state = trainer.programs.init(jax.random.PRNGKey(config.seed), trainer.example_batch())
    else:
        platform = start_runtime(config)  # as dew.main, without a compilation cache (a cold start)
        convolutions = platform.convolutions
        trainer = Trainer(config, args.workdir, resolved=True)
        compiling = trainer.compile_step_in_background()  # as Trainer.run does
        state = trainer.programs.init(jax.random.PRNGKey(config.seed), trainer.example_batch())
        compiling.wait()
    batches = iter(trainer.train_data)
    steps = 0
    first_step_done = None
    # As fit runs the step (and the loop of docs/custom_loops.md): the next step is dispatched
    # before the previous one is waited for, so the host's dispatch overlaps the devices' work;
    # the clock is read when a step has finished, and the step in flight when the budget is
    # spent finishes and counts.
    state, stats = trainer.step(state, next(batches))
    while True:
        finished = stats
        state, stats = trainer.step(state, next(batches))
        jax.block_until_ready(finished["loss"])
        steps += 1
        now = time.perf_counter() - start
        if first_step_done is None:
            first_step_done = now
        if now >= args.budget or (args.max_steps and steps + 1 >= args.max_steps):
            jax.block_until_ready(stats["loss"])
            steps += 1
            break
    trained = time.perf_counter() - start
    loss = float(stats["loss"])

    results: dict[str, list[float]] = {}
    pictures = {}
    networks = {"ema": trainer.debiased_ema(state), "raw": state.params}
    if args.params_out:
        os.makedirs(os.path.dirname(os.path.abspath(args.params_out)), exist_ok=True)
        flat = {
            f"{name}/{module}/{leaf}": np.asarray(value)
            for name, tree in jax.device_get(networks).items()
            for module, leaves in tree.items()
            for leaf, value in leaves.items()
        }
        np.savez(args.params_out, allow_pickle=False, **flat)
    objective = cast(Any, trainer.objective)  # a Diffusion
    sigmas = objective.process.sigmas(args.points)

    @jax.jit
    def draw(params, noise, labels):
        """dew's Heun sampler from the given standard-normal noise (scaled by σ_0 in ``sample``)."""
        return sample(objective.denoiser(params, {"label": labels}), noise, sigmas, "heun")

    shape = tuple(trainer.example_batch()["image"].shape[1:])
    draws = [shared.race_latents(seed, args.per_class, shape) for seed in sample_seeds]
    for name, params in networks.items():
        results[name] = []
        for i, (noise, labels) in enumerate(draws):
            images = np.asarray(draw(params, noise, labels))
            predicted = classify_digits(np.clip(images, -1, 1))
            results[name].append(float(np.mean(predicted == labels)))
            if i == 0:  # the first seed's set, one row per class (class-major), 0 at the top
                grid = ImageGrid(np.clip(images, -1, 1), columns=args.per_class)
                pictures[name] = write_png(os.path.join(args.workdir, f"samples_{name}.png"), grid)
    labels = draws[0][1]
    record = {
        "path": args.path,
        "steps": steps,
        "devices": trainer.layout.data_parallel_size,
        "convolutions": convolutions,
        "budget_s": args.budget,
        "trained_s": round(trained, 1),
        "first_step_done_s": round(first_step_done, 1),
        "batch_size": args.batch_size,
        "final_loss": round(loss, 4),
        "samples": len(labels),
        "accuracy_ema": float(np.mean(results["ema"])),
        "accuracy_raw": float(np.mean(results["raw"])),
        "sample_seeds": sample_seeds,
        "accuracy_ema_seeds": results["ema"],
        "accuracy_raw_seeds": results["raw"],
        "latents": "experiments/race_latents.py: np.random.default_rng(seed), shared with the reference",
        "pictures": pictures,
        "overrides": args.overrides,
        "load_average_1min": os.getloadavg()[0],
    }

    def seeds(name: str) -> str:
        return ", ".join(f"{a:.1%}" for a in results[name])

    print(
        f"{steps} steps in {trained:.0f} s (first step done at {first_step_done:.0f} s); "
        f"{len(labels)} Heun-{args.points} samples per seed (seeds {args.sample_seeds}) classified as "
        f"their class: {record['accuracy_ema']:.1%} (EMA; {seeds('ema')}), "
        f"{record['accuracy_raw']:.1%} (raw weights; {seeds('raw')})"
    )
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "race.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
