"""The sweep's search, apart from drawing and scoring: grid points, the coarse pass, the refined
pass around the best, and the resumable results log. No JAX here; ``dew.sweep`` supplies the
scorer (reconstruct the EMA, draw, score with a registered metric).

A ``Point`` is one setting: post-hoc EMA length ``sigma_rel``, guidance weight ``guidance``
(1: none), guidance interval ``interval`` (() = all σ; collapsed to () when ``guidance`` is 1,
where it changes nothing) and, for autoguidance, the guide's EMA length ``guide_sigma_rel``
(None: the guide's own debiased EMA).

Search: every grid point is scored at the coarse sample count; the ``top`` best (by ``goal``) are
re-scored at the fine count together with their neighbours half way (geometrically for the EMA
lengths, arithmetically for the weights) to the adjacent grid values along each axis; the
answer is the best fine-pass point.

Resume: each scored point is one line of JSON appended to ``points.jsonl`` with a single
``write`` and an fsync; a rerun reads the log (a torn last line, from a crash mid-write, is
dropped; any other malformed line is refused, naming the file and line: ``read_points``),
skips the points it holds and continues; the settings it was started with are in
``settings.json`` and a rerun with other settings is refused, naming each one that differs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

SETTINGS_FILE = "settings.json"
POINTS_FILE = "points.jsonl"
COARSE, FINE = "coarse", "fine"


class SweepError(ValueError):
    """Input the sweep cannot use; the message names the field, the value and what is accepted."""


@dataclasses.dataclass(frozen=True, order=True)
class Point:
    """One setting of the sweep (see the module docstring)."""

    sigma_rel: float
    guidance: float
    interval: tuple[float, ...]
    guide_sigma_rel: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma_rel", round(float(self.sigma_rel), 6))
        object.__setattr__(self, "guidance", round(float(self.guidance), 6))
        interval = () if self.guidance == 1.0 else tuple(round(float(v), 6) for v in self.interval)
        object.__setattr__(self, "interval", interval)
        if self.guide_sigma_rel is not None:
            object.__setattr__(self, "guide_sigma_rel", round(float(self.guide_sigma_rel), 6))

    def record(self) -> dict[str, Any]:
        return {
            "sigma_rel": self.sigma_rel,
            "guidance": self.guidance,
            "interval": list(self.interval),
            "guide_sigma_rel": self.guide_sigma_rel,
        }

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> Point:
        return cls(r["sigma_rel"], r["guidance"], tuple(r["interval"]), r.get("guide_sigma_rel"))

    def label(self) -> str:
        interval = "all" if not self.interval else f"({self.interval[0]:g},{self.interval[1]:g}]"
        guide = "" if self.guide_sigma_rel is None else f" guide_sigma_rel={self.guide_sigma_rel:.3f}"
        return f"sigma_rel={self.sigma_rel:.3f} guidance={self.guidance:g} interval={interval}{guide}"


def grid(
    sigma_rels: Sequence[float],
    guidances: Sequence[float],
    intervals: Sequence[tuple[float, ...]],
    guide_sigma_rels: Sequence[float | None] = (None,),
) -> list[Point]:
    """Every combination, duplicates (the intervals of guidance 1) removed, in a fixed order."""
    points = {
        Point(s, w, i, g) for s in sigma_rels for w in guidances for i in intervals for g in guide_sigma_rels
    }
    return sorted(points, key=lambda p: (p.guide_sigma_rel or 0.0, p.guidance, p.interval, p.sigma_rel))


def _between(values: Sequence[float], v: float, geometric: bool) -> list[float]:
    """The points half way from ``v`` to its neighbours in the sorted axis ``values``."""
    axis = sorted(set(values) | {v})
    i = axis.index(v)
    out = []
    for j in (i - 1, i + 1):
        if 0 <= j < len(axis):
            out.append(math.sqrt(v * axis[j]) if geometric else (v + axis[j]) / 2)
    return out


def refine(
    best: Iterable[Point],
    sigma_rels: Sequence[float],
    guidances: Sequence[float],
    guide_sigma_rels: Sequence[float | None] = (None,),
) -> list[Point]:
    """The fine pass: each of ``best`` and its neighbours half way to the adjacent grid values
    along the EMA-length, weight and guide-EMA axes (one axis changed at a time)."""
    out: set[Point] = set()
    for p in best:
        out.add(p)
        for s in _between(sigma_rels, p.sigma_rel, geometric=True):
            out.add(dataclasses.replace(p, sigma_rel=s))
        if p.guidance != 1.0 or len(guidances) > 1:
            for w in _between(guidances, p.guidance, geometric=False):
                out.add(Point(p.sigma_rel, w, p.interval, p.guide_sigma_rel))
        if p.guide_sigma_rel is not None:
            axis = [g for g in guide_sigma_rels if g is not None]
            for g in _between(axis, p.guide_sigma_rel, geometric=True):
                out.add(dataclasses.replace(p, guide_sigma_rel=g))
    return sorted(out, key=lambda p: (p.guide_sigma_rel or 0.0, p.guidance, p.interval, p.sigma_rel))


def ranked(scores: Mapping[Point, float], goal: str) -> list[Point]:
    """Points best first (``goal`` "min" or "max"); a non-finite score ranks last; ties by order."""

    def key(p: Point) -> tuple[bool, float, Point]:
        v = scores[p]
        bad = not math.isfinite(v)
        return (bad, 0.0 if bad else (v if goal == "min" else -v), p)

    return sorted(scores, key=key)


class ResultsLog:
    """``points.jsonl`` + ``settings.json`` in ``out``: the sweep's resumable record."""

    def __init__(self, out: str):
        self.out = out
        self.path = os.path.join(out, POINTS_FILE)

    def check_settings(self, settings: Mapping[str, Any]) -> bool:
        """True when ``out`` holds an earlier sweep with exactly these settings (resume), False
        when it holds none; raise ``SweepError`` naming every setting that differs. Writes nothing."""
        path = os.path.join(self.out, SETTINGS_FILE)
        if not os.path.exists(path):
            return False
        with open(path) as f:
            before = json.load(f)
        now = json.loads(json.dumps(dict(settings)))
        differ = [
            f"{k}={now.get(k)!r} (it was {before.get(k)!r})"
            for k in sorted(set(before) | set(now))
            if before.get(k) != now.get(k)
        ]
        if differ:
            raise SweepError(
                f"--out={self.out!r} holds a sweep with other settings: {'; '.join(differ)}; "
                "rerun with the same settings to resume, or choose another --out"
            )
        return True

    def start(self, settings: Mapping[str, Any]) -> None:
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, SETTINGS_FILE)
        if not os.path.exists(path):
            write_atomically(path, json.dumps(dict(settings), indent=1, sort_keys=True) + "\n")

    def done(self, per_class: Mapping[str, int] | None = None) -> dict[tuple[str, Point], dict[str, Any]]:
        """(pass, point) -> its record, for every complete line of the log (a torn last line,
        from a crash mid-write, is dropped). Every line is checked (``check_record``; with
        ``per_class``, each pass's sample count too): a malformed one raises ``SweepError``
        naming the file and line, since a record read wrong would put a wrong point in the
        results."""
        if not os.path.exists(self.path):
            return {}
        return read_points(self.path, per_class)

    def append(self, record: Mapping[str, Any]) -> None:
        line = (json.dumps(dict(record), sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write: a crash leaves the line whole or torn (then dropped)
            os.fsync(fd)
        finally:
            os.close(fd)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_record(r: Any, per_class: Mapping[str, int] | None = None) -> str | None:
    """What is wrong with one line of ``points.jsonl`` read as JSON, or None: a dict with
    ``pass`` (coarse/fine), ``sigma_rel`` > 0, ``guidance``, ``interval`` ([] or [lo, hi]),
    ``guide_sigma_rel`` (null or > 0), ``per_class`` (an int >= 1, the pass's own when
    ``per_class`` is given) and ``score`` (a number; NaN for a point whose samples were not
    finite); ``seconds`` >= 0 when present."""
    if not isinstance(r, dict):
        return f"a JSON {type(r).__name__}, not an object"
    for key in ("pass", "sigma_rel", "guidance", "interval", "per_class", "score"):
        if key not in r:
            return f"no {key!r}"
    if r["pass"] not in (COARSE, FINE):
        return f"pass={r['pass']!r}: expected {COARSE!r} or {FINE!r}"
    if not (_number(r["sigma_rel"]) and math.isfinite(r["sigma_rel"]) and r["sigma_rel"] > 0):
        return f"sigma_rel={r['sigma_rel']!r}: expected a number > 0"
    if not (_number(r["guidance"]) and math.isfinite(r["guidance"])):
        return f"guidance={r['guidance']!r}: expected a finite number"
    interval = r["interval"]
    if not (
        isinstance(interval, list)
        and len(interval) in (0, 2)
        and all(_number(v) and math.isfinite(v) for v in interval)
    ):
        return f"interval={interval!r}: expected [] or [lo, hi]"
    guide = r.get("guide_sigma_rel")
    if guide is not None and not (_number(guide) and math.isfinite(guide) and guide > 0):
        return f"guide_sigma_rel={guide!r}: expected null or a number > 0"
    count = r["per_class"]
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
        return f"per_class={count!r}: expected an int >= 1"
    if per_class is not None and r["pass"] in per_class and count != per_class[r["pass"]]:
        return f"per_class={count} in the {r['pass']} pass, whose settings say {per_class[r['pass']]}"
    if not _number(r["score"]):
        return f"score={r['score']!r}: expected a number"
    seconds = r.get("seconds")
    if seconds is not None and not (_number(seconds) and seconds >= 0):
        return f"seconds={seconds!r}: expected a number >= 0"
    return None


def read_points(
    path: str, per_class: Mapping[str, int] | None = None
) -> dict[tuple[str, Point], dict[str, Any]]:
    """The records of the ``points.jsonl`` at ``path`` by (pass, point), every line checked
    (``check_record``); a torn last line is dropped. Raises ``SweepError`` naming the file and
    line of the first malformed one, or of a point recorded twice."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SweepError(f"{path} cannot be read as the sweep's points: {e}") from None
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]  # a torn last line, from a crash mid-write: that point is scored again
    records: dict[tuple[str, Point], dict[str, Any]] = {}
    where: dict[tuple[str, Point], int] = {}

    def refused(number: int, problem: str) -> SweepError:
        return SweepError(
            f"{path} line {number} is malformed: {problem}; the sweep's record is refused: "
            "restore the line, or delete it to score that point again"
        )

    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise refused(number, f"not JSON ({e.msg} at column {e.colno})") from None
        problem = check_record(r, per_class)
        if problem is not None:
            raise refused(number, problem)
        key = (r["pass"], Point.from_record(r))
        if key in records:
            raise refused(number, f"the {key[0]} point {key[1].label()} again (first at line {where[key]})")
        records[key] = r
        where[key] = number
    return records


def write_atomically(path: str, text: str | bytes) -> None:
    """Write ``path`` through a temporary file and a rename: readers see the old or the new file."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_search(
    points: Sequence[Point],
    score: Callable[[Point, int], float],
    *,
    goal: str,
    coarse_per_class: int,
    fine_per_class: int,
    top: int,
    axes: Mapping[str, Sequence[Any]],
    log: ResultsLog,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Both passes; returns every record (coarse then fine), each with ``pass``, the point's
    fields, ``per_class``, ``score`` and ``seconds``. Points in ``log`` are not scored again."""
    import time

    done = log.done({COARSE: coarse_per_class, FINE: fine_per_class})
    records: list[dict[str, Any]] = []

    def one_pass(name: str, todo: Sequence[Point], per_class: int) -> dict[Point, float]:
        scores = {}
        for i, p in enumerate(todo, 1):
            r = done.get((name, p))
            if r is None:
                start = time.perf_counter()
                value = float(score(p, per_class))
                r = {
                    "pass": name,
                    **p.record(),
                    "per_class": per_class,
                    "score": value,
                    "seconds": round(time.perf_counter() - start, 3),
                }
                log.append(r)
                tail = f"({r['seconds']:.1f} s)"
            else:
                tail = "(done before)"
            progress(f"[{name} {i}/{len(todo)}] {p.label()}  score {r['score']:.6g}  {tail}")
            scores[p] = r["score"]
            records.append(r)
        return scores

    coarse = one_pass(COARSE, points, coarse_per_class)
    best = ranked(coarse, goal)[:top]
    fine_points = refine(best, axes["sigma_rels"], axes["guidances"], axes.get("guide_sigma_rels", (None,)))
    one_pass(FINE, fine_points, fine_per_class)
    return records
