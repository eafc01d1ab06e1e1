"""``python -m dew.sweep``: the grid and its refinement pick the right points for a score that is a
known function of the settings; on a tiny trained run, each point is the metric of the post-hoc
EMA ``dew.phema`` writes, an interrupted sweep resumes to the same table, bad input is one line."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from dew.sweep import grid as sweep_grid
from dew.sweep.grid import Point


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


# --- the search on a score we control ---------------------------------------------------------

SIGMA_STAR, W_STAR = 0.07, 1.7  # the score's minimum: between grid values on both axes


def known_score(p: Point, per_class: int) -> float:
    """Lowest at (σ_rel*, w*); the interval (0.3, 5] knocks 0.5 off; more samples remove a bias
    that, at the coarse count, favours the small EMA lengths."""
    bias = 0.3 * math.log(p.sigma_rel) if per_class < 10 else 0.0
    interval = -0.5 if p.interval == (0.3, 5.0) else 0.0
    return (math.log(p.sigma_rel / SIGMA_STAR)) ** 2 + (p.guidance - W_STAR) ** 2 + interval + bias


def test_the_grid_and_its_refinement_find_the_best_setting(tmp_path):
    sigmas, weights, intervals = (0.03, 0.05, 0.1, 0.2), (1.0, 1.5, 2.0, 3.0), ((), (0.3, 5.0))
    points = sweep_grid.grid(sigmas, weights, intervals)
    # guidance 1 ignores the interval: its two intervals are one point.
    assert len(points) == len(sigmas) * (1 + (len(weights) - 1) * len(intervals))
    calls = []

    def score(p, n):
        calls.append((p, n))
        return known_score(p, n)

    log = sweep_grid.ResultsLog(str(tmp_path))
    records = sweep_grid.run_search(
        points,
        score,
        goal="min",
        coarse_per_class=2,
        fine_per_class=20,
        top=2,
        axes={"sigma_rels": sigmas, "guidances": weights},
        log=log,
        progress=lambda line: None,
    )
    coarse = {Point.from_record(r): r["score"] for r in records if r["pass"] == "coarse"}
    fine = {Point.from_record(r): r["score"] for r in records if r["pass"] == "fine"}
    assert set(coarse) == set(points)
    assert all(n == 2 for p, n in calls[: len(points)]) and all(n == 20 for p, n in calls[len(points) :])
    # The coarse pass, biased towards short EMAs, ranks σ_rel 0.05 at w 1.5 and 2.0 first ...
    top = sweep_grid.ranked(coarse, "min")[:2]
    assert top == [Point(0.05, 1.5, (0.3, 5.0)), Point(0.05, 2.0, (0.3, 5.0))], top
    # ... the fine pass scores them and their half-way neighbours along each axis, unbiased:
    low, high = math.sqrt(0.03 * 0.05), math.sqrt(0.05 * 0.1)
    want = {
        Point(s, w, (0.3, 5.0))
        for s, w in [
            (0.05, 1.5), (low, 1.5), (high, 1.5), (0.05, 1.25), (0.05, 1.75),
            (0.05, 2.0), (low, 2.0), (high, 2.0), (0.05, 2.5),
        ]
    }  # fmt: skip
    assert set(fine) == want
    best = sweep_grid.ranked(fine, "min")[0]
    # The best is off the grid: σ_rel √(0.05·0.1) (nearest σ_rel* = 0.07) at w = 1.5, and it is
    # known_score's minimum over the fine points.
    assert best == Point(high, 1.5, (0.3, 5.0)) == min(want, key=lambda p: known_score(p, 20))
    for p, v in fine.items():
        assert v == known_score(p, 20)
    assert sweep_grid.ranked(fine, "max")[0] != best  # the goal matters


def test_a_torn_last_line_is_dropped_and_its_point_scored_again(tmp_path):
    log = sweep_grid.ResultsLog(str(tmp_path))
    log.append({"pass": "coarse", **Point(0.05, 1.0, ()).record(), "per_class": 2, "score": 1.0})
    with open(log.path, "a") as f:
        f.write('{"pass": "coarse", "sigma_rel": 0.1, "gui')  # a crash mid-write
    assert list(log.done()) == [("coarse", Point(0.05, 1.0, ()))]


@pytest.mark.parametrize(
    "line, says",
    [
        ('{"pass": "coarse", "sigma_rel": 0.1, "gui', "not JSON (Unterminated string"),
        ("[1, 2]", "a JSON list, not an object"),
        (
            '{"pass": "medium", "sigma_rel": 0.1, "guidance": 1, "interval": [], "per_class": 2, "score": 1}',
            "pass='medium': expected 'coarse' or 'fine'",
        ),
        (
            '{"pass": "coarse", "sigma_rel": -1, "guidance": 1, "interval": [], "per_class": 2, "score": 1}',
            "sigma_rel=-1: expected a number > 0",
        ),
        (
            '{"pass": "coarse", "sigma_rel": 0.1, "guidance": 1, "interval": [3], "per_class": 2, '
            '"score": 1}',
            "interval=[3]: expected [] or [lo, hi]",
        ),
        (
            '{"pass": "coarse", "sigma_rel": 0.1, "guidance": 1, "interval": [], "per_class": 5, "score": 1}',
            "per_class=5 in the coarse pass, whose settings say 2",
        ),
        ('{"pass": "coarse", "sigma_rel": 0.1, "guidance": 1, "interval": [], "per_class": 2}', "no 'score'"),
        (
            '{"pass": "coarse", "sigma_rel": 0.05, "guidance": 1, "interval": [], "per_class": 2, '
            '"score": 3}',
            "the coarse point sigma_rel=0.050 guidance=1 interval=all again (first at line 1)",
        ),
    ],
)
def test_a_malformed_line_of_the_points_is_refused_naming_the_file_and_line(tmp_path, line, says):
    """Any line but a torn last one: refused (a record read wrong would be a wrong result)."""
    log = sweep_grid.ResultsLog(str(tmp_path))
    log.append({"pass": "coarse", **Point(0.05, 1.0, ()).record(), "per_class": 2, "score": 1.0})
    with open(log.path, "a") as f:
        f.write(line + "\n")
    log.append({"pass": "fine", **Point(0.05, 1.0, ()).record(), "per_class": 4, "score": 0.5})
    with pytest.raises(sweep_grid.SweepError) as caught:
        log.done({"coarse": 2, "fine": 4})
    message = str(caught.value)
    assert message.startswith(f"{log.path} line 2 is malformed: ") and says in message, message
    assert "\n" not in message


def test_each_pass_is_drawn_on_its_own_axis_with_its_sample_count(tmp_path):
    """A Fréchet distance falls with the sample count: the fine pass (30 per class, ~3x lower)
    gets its own panel and axis, so its points spread over the panel instead of sitting in a
    band at the bottom of the coarse pass's axis."""
    from PIL import Image

    from dew.sweep.plot import draw_sweep, samples_text

    coarse = [(0.03, 1.0305), (0.05, 1.0356), (0.08, 1.0391), (0.12, 1.039), (0.18, 1.047), (0.25, 1.1071)]
    fine = [(0.03, 0.3459), (0.0387, 0.3398), (0.05, 0.3372), (0.0632, 0.3367)]
    records = [
        {"pass": name, **Point(s, 1.0, ()).record(), "per_class": n, "score": v}
        for name, n, points in (("coarse", 10, coarse), ("fine", 30, fine))
        for s, v in points
    ]
    path = str(tmp_path / "sweep.png")
    draw_sweep(records, records[-1], "digits_frechet_distance", path, classes=10)
    image = np.asarray(Image.open(path).convert("RGB"))
    colour = np.all(image == (31, 119, 180), axis=-1)  # the series' colour (PALETTE[0])
    height, width = colour.shape
    legend = width - 170
    halves = (colour[:, : (80 + legend) // 2], colour[:, (80 + legend) // 2 : legend])
    spans = [np.ptp(np.nonzero(half.any(axis=1))[0]) for half in halves]
    plot_height = height - 78 - 60
    assert all(span > 0.6 * plot_height for span in spans), (spans, plot_height)
    assert samples_text([10] * 6, 10) == "10 per class x 10 classes = 100 samples"
    assert samples_text([30] * 4, None) == "30 samples per class"


# --- on a trained run --------------------------------------------------------------------------


def mean_brightness(images, labels=None) -> float:
    """A metric of the images alone (deterministic, varies with the EMA): their mean."""
    return float(np.mean(images))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from helpers_common import tiny_config

    from dew import registry
    from dew.training.trainer import Trainer

    if "test_mean_brightness" not in registry.metrics:
        registry.metrics.register("test_mean_brightness", registry.Metric(mean_brightness, goal="max"))
    config = tiny_config(
        **{
            "ema.power_std_rels": (0.05, 0.1),
            "ema.snapshot_every": 2,
            "eval.every": 0,
            "preview.every": 0,
            "train.num_steps": 6,
            "checkpoint.every": 6,
        }
    )
    workdir = str(tmp_path_factory.mktemp("sweep") / "run")
    Trainer(config, workdir).run()
    return workdir


ARGS = [
    "--metric=test_mean_brightness",
    "--sigma_rels=(0.04, 0.08, 0.16)",
    "--guidance=(1.0, 2.0)",
    "--intervals=((), (0.5, 10.0))",
    "--coarse_per_class=1",
    "--fine_per_class=2",
    "--top=1",
    "--steps=3",
]


def test_the_sweep_scores_the_phema_reconstruction_resumes_and_writes_the_table(run_dir, tmp_path, capsys):
    from dew import phema
    from dew.inference import pipeline
    from dew.sweep import cli

    out = str(tmp_path / "sweep")
    argv = [f"--workdir={run_dir}", f"--out={out}", *ARGS]
    # Interrupt after three points: the scorer raises on the fourth.
    real = cli.make_scorer
    scored = []

    def interrupted(p):
        score = real(p)

        def once(point, n):
            if len(scored) == 3:
                raise KeyboardInterrupt
            scored.append(point)
            return score(point, n)

        return once

    cli.make_scorer = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            cli.main(argv)
    finally:
        cli.make_scorer = real
    lines = _read(os.path.join(out, "points.jsonl")).splitlines()
    assert len(lines) == 3 and not os.path.exists(os.path.join(out, "sweep.json"))
    capsys.readouterr()

    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "resuming" in printed and printed.count("(done before)") == 3, printed
    first = json.loads(_read(os.path.join(out, "sweep.json")))
    records = first["records"]
    # 3 σ × (1 + 1 × 2) = 9 grid points; then the best and its neighbours.
    coarse = [r for r in records if r["pass"] == "coarse"]
    assert (
        len(coarse) == 9 and len({(r["sigma_rel"], r["guidance"], tuple(r["interval"])) for r in coarse}) == 9
    )
    # The best is the best fine-pass score (goal max, the metric's own).
    fine = [r for r in records if r["pass"] == "fine"]
    assert first["best"] == max(fine, key=lambda r: r["score"]) and first["settings"]["goal"] == "max"
    top = max(coarse, key=lambda r: r["score"])
    assert any(r["sigma_rel"] == top["sigma_rel"] and r["guidance"] == top["guidance"] for r in fine)

    # A point's score is the metric of what dew.phema's reconstruction draws.
    point = coarse[0]
    phema_out, _ = phema.reconstruct_run(run_dir, point["sigma_rel"], out=str(tmp_path / "phema"))
    images = pipeline(phema_out)(
        per_class=1, steps=3, guidance=point["guidance"], guidance_interval=tuple(point["interval"]), seed=0
    ).images
    assert mean_brightness(images) == point["score"]
    assert len({r["score"] for r in coarse}) > 1  # the EMA length changes the samples

    # A second rerun scores nothing and gives the same table and files.
    table = printed[printed.index("| pass") :]
    assert cli.main(argv) == 0
    again = capsys.readouterr().out
    assert again.count("(done before)") == len(records)
    assert again[again.index("| pass") :] == table
    assert json.loads(_read(os.path.join(out, "sweep.json"))) == first
    csv_lines = _read(os.path.join(out, "sweep.csv")).splitlines()
    assert csv_lines[0].startswith("pass,sigma_rel") and len(csv_lines) == 1 + len(records)
    from PIL import Image

    assert Image.open(os.path.join(out, "sweep.png")).size == (1010, 500)  # a panel per pass

    # Other settings in the same --out: refused, naming each difference, nothing written.
    before = _read(os.path.join(out, "points.jsonl"))
    assert cli.main([*argv, "--seed=1", "--top=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "seed=1 (it was 0)" in err and "top=2 (it was 1)" in err, err
    assert _read(os.path.join(out, "points.jsonl")) == before

    # A damaged record (a score edited into a string): the resume refuses it in one line naming
    # the file and line, before anything is scored or written.
    points = os.path.join(out, "points.jsonl")
    lines = before.splitlines(keepends=True)
    lines[1] = lines[1].replace('"score": ', '"score": "x', 1).replace(', "seconds"', '", "seconds"', 1)
    with open(points, "w") as f:
        f.write("".join(lines))
    damaged = _read(points)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: {points} line 2 is malformed: score='x"), err
    assert _read(points) == damaged


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--metric=no_such_metric"], "--metric='no_such_metric' is invalid: unknown metrics"),
        (["--sigma_rels=(0.05, 0.5)"], "--sigma_rels=[0.5] is invalid"),
        (["--intervals=((5.0, 1.0),)"], "--intervals=((5.0, 1.0),) is invalid"),
        (["--guide=/nonexistent/run"], "'/nonexistent/run' is not a directory"),
        (["--guide_sigma_rels=(0.1,)"], "--guide_sigma_rels is given without --guide"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(run_dir, tmp_path, capsys, extra, says):
    from dew.sweep import cli

    out = tmp_path / "sweep"
    argv = [f"--workdir={run_dir}", f"--out={out}", *ARGS]
    argv = [a for a in argv if a.split("=")[0] not in {e.split("=")[0] for e in extra}] + extra
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and says in err, err
    assert not out.exists()


def test_a_run_without_power_ema_snapshots_is_refused(run_dir, tmp_path, capsys):
    import shutil

    from dew.sweep import cli

    bare = tmp_path / "bare"
    shutil.copytree(run_dir, bare, ignore=shutil.ignore_patterns("power_ema"))
    assert cli.main([f"--workdir={bare}", *ARGS]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no power-EMA snapshots" in err and "power_std_rels" in err and "\n" not in err, err
    assert not (bare / "sweep").exists()


def test_autoguidance_sweeps_the_guides_ema_length(run_dir, tmp_path, capsys):
    from dew.sweep import cli

    out = tmp_path / "sweep"
    argv = [
        f"--workdir={run_dir}",
        f"--out={out}",
        f"--guide={run_dir}",  # the run guides itself: same data and conditioning
        "--guide_sigma_rels=(0.05, 0.16)",
        "--metric=test_mean_brightness",
        "--sigma_rels=(0.08,)",
        "--guidance=(3.0,)",
        "--coarse_per_class=1",
        "--fine_per_class=1",
        "--top=1",
        "--steps=3",
    ]
    assert cli.main(argv) == 0, capsys.readouterr().err
    result = json.loads(_read(str(out / "sweep.json")))
    coarse = {r["guide_sigma_rel"]: r["score"] for r in result["records"] if r["pass"] == "coarse"}
    fine = {r["guide_sigma_rel"] for r in result["records"] if r["pass"] == "fine"}
    assert set(coarse) == {0.05, 0.16} and coarse[0.05] != coarse[0.16]  # the guide's EMA matters
    best = max(coarse, key=lambda sigma_rel: coarse[sigma_rel])
    assert fine == {best, round(math.sqrt(0.05 * 0.16), 6)}
    assert result["settings"]["guide"] == os.path.abspath(run_dir)


def test_a_checkpoint_between_two_power_ema_snapshots_is_refused_naming_the_snapshot_updates(
    run_dir, tmp_path, capsys
):
    import shutil

    from dew.sweep import cli

    # A run preempted between two snapshots: its last checkpoint (6) is after its last snapshot (4).
    preempted = tmp_path / "preempted"
    shutil.copytree(run_dir, preempted, ignore=shutil.ignore_patterns("6"))
    shutil.copytree(os.path.join(run_dir, "checkpoints", "6"), preempted / "checkpoints" / "6")
    assert cli.main([f"--workdir={preempted}", *ARGS]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: --step=6 is invalid: the run has no power-EMA snapshot at update 6; its snapshots are "
        "at updates [2, 4]: expected a checkpoint at one of them (--step for the run, a step directory "
        "for --guide)"
    ), err
    assert not (preempted / "sweep").exists()
