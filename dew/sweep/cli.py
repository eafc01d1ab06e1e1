"""``python -m dew.sweep --workdir=RUN --metric=NAME [--sigma_rels=...] [--guidance=...]
[--intervals=...] [--guide=WORKDIR --guide_sigma_rels=...] [--out=DIR] ...``

One sweep after training (EDM2, Karras et al. 2024, Sec. 3 and Fig. 5): for every post-hoc EMA
length in ``--sigma_rels`` the run's EMA is reconstructed from its power-EMA snapshots
(``<RUN>/power_ema``, ``dew.averaging.posthoc.reconstruct``, the least-squares solution
``python -m dew.phema`` writes) at the step of the checkpoint read (``--step``, default the
latest); with every guidance weight in ``--guidance`` (1: none) and interval in ``--intervals``
(``()`` = every σ, ``(lo, hi)`` = σ in (lo, hi]) samples are drawn through ``dew.pipeline`` (the
same noise, ``--seed``, for every point) and scored by the registered metric ``--metric``
(``metric(images, labels)``, labels the classes asked for). ``--guide=WORKDIR`` guides with a
second run's network (autoguidance) instead of the unconditional branch; its EMA length is a
further axis, ``--guide_sigma_rels`` (default: its own debiased EMA), reconstructed from its
snapshots the same way.

First every grid point at ``--coarse_per_class`` samples per class, then the ``--top`` best
and their neighbours half way to the adjacent grid values at ``--fine_per_class``
(``dew.sweep.grid``). A progress line per point. Written to ``--out`` (default
``RUN/sweep``): ``points.jsonl`` (each point appended as scored: an interrupted sweep rerun with
the same arguments resumes, skipping them; other arguments are refused, naming what differs),
``settings.json``, and at the end ``sweep.json`` (settings, best, every point), ``sweep.csv``
and ``sweep.png`` (the metric against σ_rel); the table is printed.

``--goal`` is ``min`` or ``max``; its default is the metric's ``goal`` (``dew.registry.Metric``;
``digits_class_accuracy``: max; a plain registered function: ``min``, as FID and FD). Bad input
(an unknown metric, a run without power-EMA snapshots, a guide of other resolution or
conditioning, a value out of range, settings that differ from the sweep in ``--out``): one line
on stderr, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from dew.sweep import grid as sweep_grid
from dew.sweep.grid import Point, SweepError

DEFAULT_SIGMA_RELS = (0.02, 0.04, 0.06, 0.08, 0.1, 0.13, 0.17, 0.22)


def _literal_tuple(what: str) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise argparse.ArgumentTypeError(f"{what}={text!r} is not a Python literal tuple") from None
        if isinstance(value, int | float) and what != "--intervals":
            value = (value,)
        if not isinstance(value, tuple | list):
            raise argparse.ArgumentTypeError(
                f"{what}={text!r} is invalid: expected a tuple, e.g. (0.05, 0.1)"
            )
        return tuple(value)

    return parse


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    assert __doc__ is not None  # the description is the module docstring
    p = argparse.ArgumentParser(prog="python -m dew.sweep", description=__doc__.split("\n\n")[1])
    p.add_argument("--workdir", required=True, help="a run trained with config.ema.power_std_rels")
    p.add_argument("--metric", required=True, help="a registered metric, e.g. digits_class_accuracy, fid")
    p.add_argument("--goal", choices=("min", "max"), default=None, help="default: the metric's own")
    p.add_argument("--sigma_rels", type=_literal_tuple("--sigma_rels"), default=DEFAULT_SIGMA_RELS)
    p.add_argument("--guidance", type=_literal_tuple("--guidance"), default=(1.0,))
    p.add_argument("--intervals", type=_literal_tuple("--intervals"), default=((),))
    p.add_argument("--guide", default=None, help="a second run's workdir: autoguidance")
    p.add_argument("--guide_sigma_rels", type=_literal_tuple("--guide_sigma_rels"), default=None)
    p.add_argument("--coarse_per_class", type=int, default=10)
    p.add_argument("--fine_per_class", type=int, default=50)
    p.add_argument("--top", type=int, default=2, help="coarse points refined")
    p.add_argument("--steps", type=int, default=None, help="sampler σ points (default: the run's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--out", default=None, help="output directory (default RUN/sweep)")
    return p.parse_args(argv)


def _check_values(args: argparse.Namespace) -> None:
    from dew.averaging import posthoc

    try:
        posthoc.parse_std_rels(list(args.sigma_rels), "--sigma_rels")
        if args.guide_sigma_rels is not None:
            posthoc.parse_std_rels(list(args.guide_sigma_rels), "--guide_sigma_rels")
    except ValueError as e:
        raise SweepError(str(e)) from None
    bad = [w for w in args.guidance if isinstance(w, bool) or not isinstance(w, int | float) or not w > 0]
    if bad or not args.guidance:
        raise SweepError(
            f"--guidance={args.guidance!r} is invalid: expected weights > 0, e.g. (1.0, 1.5, 2.0)"
        )
    intervals = args.intervals
    if intervals == () or (len(intervals) == 2 and all(isinstance(v, int | float) for v in intervals)):
        intervals = (intervals,)  # one interval given bare
    for i in intervals:
        ok = isinstance(i, tuple | list) and (
            len(i) == 0 or (len(i) == 2 and all(isinstance(v, int | float) for v in i) and 0 <= i[0] < i[1])
        )
        if not ok:
            raise SweepError(
                f"--intervals={args.intervals!r} is invalid: {i!r} is not () or (lo, hi) with 0 <= lo < hi; "
                "expected e.g. '((), (0.28, 2.9))'"
            )
    args.intervals = tuple(tuple(float(v) for v in i) for i in intervals)
    for name in ("coarse_per_class", "fine_per_class", "top"):
        if getattr(args, name) < 1:
            raise SweepError(f"--{name}={getattr(args, name)} is invalid: expected an int >= 1")
    if args.fine_per_class < args.coarse_per_class:
        raise SweepError(
            f"--fine_per_class={args.fine_per_class} is invalid: expected >= --coarse_per_class="
            f"{args.coarse_per_class} (the refined pass draws more samples)"
        )
    if args.guide_sigma_rels is not None and args.guide is None:
        raise SweepError("--guide_sigma_rels is given without --guide=WORKDIR; expected both or neither")


def _check_snapshot_at(snapshots, updates: int, flag: str, whose: str) -> None:
    """``SweepError`` unless a power-EMA snapshot was taken at ``updates`` (post-hoc EMA
    reconstructs an average at a snapshot's time only: a run preempted between two snapshots
    has a checkpoint at a step without one)."""
    times = sorted({int(s.t) for s in snapshots})
    if updates not in times:
        raise SweepError(
            f"{flag} is invalid: {whose} has no power-EMA snapshot at update {updates}; its snapshots "
            f"are at updates {times}: expected a checkpoint at one of them (--step for the run, "
            "a step directory for --guide)"
        )


def _snapshots(workdir: str, what: str):
    from dew.averaging.power_ema import SNAPSHOT_DIR, PowerEMASnapshots

    directory = os.path.join(workdir, SNAPSHOT_DIR)
    if not os.path.isdir(directory):
        raise SweepError(
            f"{what}={workdir!r} has no power-EMA snapshots ({directory}); train it with "
            "--config.ema.power_std_rels='(0.05, 0.1)' to save them"
        )
    store = PowerEMASnapshots(directory, read_only=True)
    snapshots = store.snapshots()
    store.close()
    if not snapshots:
        raise SweepError(f"{what}={workdir!r} has no power-EMA snapshots in {directory} yet")
    return snapshots


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """Check everything (nothing written); returns what ``run`` needs: the pipelines, the
    snapshots, the metric, the grid, the settings."""
    from dew import registry
    from dew.contracts.state import num_updates
    from dew.inference import PipelineError, pipeline
    from dew.registry import UnknownNameError

    _check_values(args)
    try:
        metric = registry.as_metric(registry.metrics[args.metric])
    except UnknownNameError as e:
        raise SweepError(f"--metric={args.metric!r} is invalid: {e}") from None
    try:
        metric.check_ready()
    except (OSError, ValueError) as e:
        raise SweepError(f"--metric={args.metric!r} cannot be scored: {e}") from None
    goal = args.goal or metric.goal
    workdir = os.path.abspath(args.workdir)
    if not os.path.isdir(workdir):
        raise SweepError(f"--workdir={args.workdir!r} is not a directory (expected a dew run's workdir)")
    try:
        main = pipeline(workdir, step=args.step, guide=args.guide)
    except PipelineError as e:
        raise SweepError(str(e).removeprefix("pipeline: ")) from None
    snapshots = _snapshots(workdir, "--workdir")
    updates = int(num_updates(main.step, main.config.train.accumulation))
    _check_snapshot_at(snapshots, updates, f"--step={main.step}", "the run")
    guide_snapshots, guide_updates = None, None
    if args.guide is not None and args.guide_sigma_rels is not None:
        guide_snapshots = _snapshots(os.path.abspath(args.guide), "--guide")
        assert main.guide is not None  # pipeline(guide=args.guide) loaded it
        guide_updates = int(num_updates(main.guide.step, main.guide.config.train.accumulation))
        _check_snapshot_at(guide_snapshots, guide_updates, f"--guide={args.guide!r}", "the guide")
    steps = args.steps if args.steps is not None else int(main.options.get("steps", 0))
    if steps < 1:
        raise SweepError(f"--steps={args.steps} is invalid: expected an int >= 1")
    guide_axis: tuple = (None,) if args.guide_sigma_rels is None else tuple(args.guide_sigma_rels)
    settings = {
        "workdir": workdir,
        "step": main.step,
        "metric": args.metric,
        "goal": goal,
        "sigma_rels": list(args.sigma_rels),
        "guidance": list(args.guidance),
        "intervals": [list(i) for i in args.intervals],
        "guide": None if args.guide is None else os.path.abspath(args.guide),
        "guide_step": None if main.guide is None else main.guide.step,
        "guide_sigma_rels": None if args.guide_sigma_rels is None else list(args.guide_sigma_rels),
        "coarse_per_class": args.coarse_per_class,
        "fine_per_class": args.fine_per_class,
        "top": args.top,
        "steps": steps,
        "seed": args.seed,
    }
    out = os.path.abspath(args.out or os.path.join(workdir, "sweep"))
    log = sweep_grid.ResultsLog(out)
    resuming = log.check_settings(settings)
    if resuming:  # a malformed record is refused now, before anything is scored
        log.done({sweep_grid.COARSE: args.coarse_per_class, sweep_grid.FINE: args.fine_per_class})
    return {
        "main": main,
        "snapshots": snapshots,
        "updates": updates,
        "guide_snapshots": guide_snapshots,
        "guide_updates": guide_updates,
        "metric": metric,
        "goal": goal,
        "settings": settings,
        "log": log,
        "resuming": resuming,
        "points": sweep_grid.grid(args.sigma_rels, args.guidance, args.intervals, guide_axis),
        "axes": {"sigma_rels": args.sigma_rels, "guidances": args.guidance, "guide_sigma_rels": guide_axis},
    }


def make_scorer(p: dict[str, Any]) -> Callable[[Point, int], float]:
    """score(point, per_class): the metric on samples of the run's EMA reconstructed at
    ``point.sigma_rel`` (and the guide's at ``point.guide_sigma_rel``), drawn with the point's
    guidance from the sweep's seed."""
    import jax
    import numpy as np

    from dew.averaging import posthoc
    from dew.inference import Pipeline

    main = p["main"]
    settings = p["settings"]

    def placed(like, params):
        return jax.tree.map(lambda new, old: jax.device_put(np.asarray(new), old.sharding), params, like)

    cache: dict[tuple[str, float], Any] = {}

    def params_at(which: str, sigma_rel: float):
        if (which, sigma_rel) not in cache:
            source = main if which == "main" else main.guide
            snapshots = p["snapshots"] if which == "main" else p["guide_snapshots"]
            updates = p["updates"] if which == "main" else p["guide_updates"]
            cache[(which, sigma_rel)] = placed(
                source.params, posthoc.reconstruct(snapshots, sigma_rel, updates)
            )
        return cache[(which, sigma_rel)]

    num_classes = getattr(main.objective, "num_classes", None) or 1

    def score(point: Point, per_class: int) -> float:
        guide = main.guide
        if guide is not None and point.guide_sigma_rel is not None:
            guide = Pipeline(
                guide.objective,
                guide.config,
                guide.step,
                params_at("guide", point.guide_sigma_rel),
                False,
                guide.workdir,
            )
        task = Pipeline(
            main.objective,
            main.config,
            main.step,
            params_at("main", point.sigma_rel),
            False,
            main.workdir,
            guide,
        )
        artifact = task(
            per_class=per_class,
            steps=settings["steps"],
            guidance=float(point.guidance),
            guidance_interval=tuple(point.interval),
            seed=settings["seed"],
        )
        images = np.asarray(artifact.images)
        if not np.all(np.isfinite(images)):
            return float("nan")
        labels = np.repeat(np.arange(num_classes), per_class)
        return float(p["metric"](images, labels))

    return score


COLUMNS = ("pass", "sigma_rel", "guidance", "interval", "guide_sigma_rel", "per_class", "score", "seconds")


def table(records: Sequence[dict[str, Any]], goal: str) -> str:
    """The records as a markdown table, each pass ranked best first."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name in (sweep_grid.FINE, sweep_grid.COARSE):
        rows = [r for r in records if r["pass"] == name]
        scores = {Point.from_record(r): r for r in rows}
        for point in sweep_grid.ranked({q: r["score"] for q, r in scores.items()}, goal):
            r = scores[point]
            cells = [_cell(k, r[k]) for k in COLUMNS]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(name: str, value: Any) -> str:
    if name == "interval":
        return "all" if not value else f"({value[0]:g}, {value[1]:g}]"
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if name != "seconds" else f"{value:.1f}"
    return str(value)


def best_record(records: Sequence[dict[str, Any]], goal: str) -> dict[str, Any]:
    """The best fine-pass record."""
    fine = {Point.from_record(r): r for r in records if r["pass"] == sweep_grid.FINE}
    return fine[sweep_grid.ranked({q: r["score"] for q, r in fine.items()}, goal)[0]]


def write_results(
    out: str,
    settings: dict[str, Any],
    records: Sequence[dict[str, Any]],
    goal: str,
    classes: int | None = None,
) -> dict:
    from dew.sweep.plot import draw_sweep

    best = best_record(records, goal)
    result = {"settings": settings, "best": best, "records": list(records)}
    sweep_grid.write_atomically(os.path.join(out, "sweep.json"), json.dumps(result, indent=1) + "\n")
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(COLUMNS)
    for r in records:
        writer.writerow(
            [
                " ".join(f"{v:g}" for v in r[k]) if k == "interval" else ("" if r[k] is None else r[k])
                for k in COLUMNS
            ]
        )
    sweep_grid.write_atomically(os.path.join(out, "sweep.csv"), text.getvalue())
    png = os.path.join(out, "sweep.png")
    draw_sweep(records, best, settings["metric"], png + ".tmp", classes)
    os.replace(png + ".tmp", png)
    return result


def run(args: argparse.Namespace, plan_: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sweep (after ``plan``): both passes, then the files; returns ``sweep.json``'s content."""
    p = plan_ or plan(args)
    log = p["log"]
    log.start(p["settings"])
    verb = "resuming" if p["resuming"] else "starting"
    print(
        f"sweep: {verb} {len(p['points'])} grid points, {p['settings']['metric']} ({p['goal']}) -> {log.out}",
        flush=True,
    )
    records = sweep_grid.run_search(
        p["points"],
        make_scorer(p),
        goal=p["goal"],
        coarse_per_class=p["settings"]["coarse_per_class"],
        fine_per_class=p["settings"]["fine_per_class"],
        top=p["settings"]["top"],
        axes=p["axes"],
        log=log,
        progress=lambda line: print(line, flush=True),
    )
    classes = getattr(p["main"].objective, "num_classes", None) or 1  # the scorer's labels
    result = write_results(log.out, p["settings"], records, p["goal"], classes)
    print(table(records, p["goal"]), flush=True)
    best = Point.from_record(result["best"])
    print(f"best: {best.label()}  {p['settings']['metric']} {result['best']['score']:.6g}", flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as e:  # argparse's own errors exit 2 already; --help exits 0
        return int(e.code or 0)
    try:
        p = plan(args)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = run(args, p)
    return 0 if math.isfinite(result["best"]["score"]) else 1


if __name__ == "__main__":
    sys.exit(main())
