"""The sweep's figure, drawn with PIL (a dependency; matplotlib is not): the metric against the
post-hoc EMA length σ_rel on a log axis, in the manner of EDM2's FID-vs-EMA-length figure
(Karras et al. 2024, Fig. 5), one line per (guidance weight, interval, guide EMA) setting.

Each pass gets its own panel with its own metric axis, titled with the sample count every one of
its points was scored at: a Fréchet distance (FID, FD) is biased upwards by an amount that falls
with the sample count, so the coarse pass (fewer samples) and the fine pass (more) are not
comparable to each other, only within themselves. The σ_rel axis is the same in both panels;
the coarse points are dots joined by lines, the fine ones squares, the best (fine) point ringed.

``python -m dew.sweep.plot POINTS.jsonl OUT.png --metric=NAME [--classes=N] [--goal=min|max]``
redraws the figure from a sweep's ``points.jsonl`` (read and checked as a resume reads it), e.g.
after the sweep's directory was cleaned up but its points kept.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dew.tracking.render import PALETTE

PASSES = (("coarse", "dots"), ("fine", "squares"))
"""The sweep's passes in the order drawn, with their markers."""


def _series_key(r: Mapping[str, Any]) -> tuple:
    return (r["guidance"], tuple(r["interval"]), r.get("guide_sigma_rel"))


def _series_label(key: tuple) -> str:
    w, interval, g = key
    text = "no guidance" if w == 1.0 else f"w={w:g}"
    if interval:
        text += f" in ({interval[0]:g},{interval[1]:g}]"
    if g is not None:
        text += f", guide EMA {g:.3f}"
    return text


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / count))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= count:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def samples_text(per_class: Sequence[int], classes: int | None) -> str:
    """What each point of a pass was scored on: '10 per class x 10 classes = 100 samples'."""
    counts = sorted(set(per_class))
    if len(counts) != 1:
        return "per class: " + ", ".join(map(str, counts))
    if classes is None:
        return f"{counts[0]} samples per class"
    if classes == 1:
        return f"{counts[0]} samples"
    return f"{counts[0]} per class x {classes} classes = {counts[0] * classes} samples"


def draw_sweep(
    records: Sequence[Mapping[str, Any]],
    best: Mapping[str, Any],
    metric: str,
    path: str,
    classes: int | None = None,
) -> None:
    """Write the figure of ``records`` (the sweep's, coarse and fine) to the PNG ``path``;
    ``classes``: the classes each point drew ``per_class`` samples of (None: not said)."""
    from PIL import Image, ImageDraw, ImageFont

    finite = [r for r in records if math.isfinite(r["score"]) and r["sigma_rel"] > 0]
    panels = [(name, marker) for name, marker in PASSES if any(r["pass"] == name for r in finite)]
    panel_w, gap, left, legend_w = 340, 80, 80, 170
    top, bottom, height = 78, 60, 500
    width = left + len(panels) * panel_w + (len(panels) - 1) * gap + legend_w
    image = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    d.text((left, 12), f"{metric} vs post-hoc EMA length, each pass on its own axis", fill="black", font=font)
    d.text(
        (left, 28),
        "a Frechet distance falls with the sample count: compare points within a panel, not across",
        fill=(90, 90, 90),
        font=font,
    )
    if not finite:
        d.text((left, top + 20), "no finite score to draw", fill="black", font=font)
        image.save(path, format="PNG")
        return
    xs = [math.log(r["sigma_rel"]) for r in finite]
    x_lo, x_hi = min(xs), max(xs)
    pad_x = (x_hi - x_lo) * 0.06 or 0.1
    x_lo, x_hi = x_lo - pad_x, x_hi + pad_x
    keys = sorted({_series_key(r) for r in finite}, key=lambda k: (k[2] or 0.0, k[0], k[1]))
    colours = {key: PALETTE[i % len(PALETTE)] for i, key in enumerate(keys)}
    sigmas = sorted({r["sigma_rel"] for r in finite if r["pass"] == "coarse"}) or sorted(
        {r["sigma_rel"] for r in finite}
    )

    for index, (name, marker) in enumerate(panels):
        x0 = left + index * (panel_w + gap)
        x1 = x0 + panel_w
        own = [r for r in finite if r["pass"] == name]
        ys = [r["score"] for r in own]
        y_lo, y_hi = min(ys), max(ys)
        pad_y = (y_hi - y_lo) * 0.1 or abs(y_hi) * 0.01 or 1.0
        y_lo, y_hi = y_lo - pad_y, y_hi + pad_y

        def px(r: Mapping[str, Any], x0=x0, x1=x1, y_lo=y_lo, y_hi=y_hi) -> tuple[float, float]:
            x = x0 + (math.log(r["sigma_rel"]) - x_lo) / (x_hi - x_lo) * (x1 - x0)
            y = height - bottom - (r["score"] - y_lo) / (y_hi - y_lo) * (height - top - bottom)
            return x, y

        d.text((x0, top - 26), f"{name} pass ({marker})", fill="black", font=font)
        d.text(
            (x0, top - 13),
            "each point: " + samples_text([r["per_class"] for r in own], classes),
            fill="black",
            font=font,
        )
        d.rectangle([x0, top, x1, height - bottom], outline="black")
        for v in _nice_ticks(y_lo, y_hi, 6):
            _, y = px({"sigma_rel": math.exp(x_lo), "score": v})
            d.line([x0 - 4, y, x0, y], fill="black")
            d.line([x0 + 1, y, x1 - 1, y], fill=(230, 230, 230))
            d.text((x0 - 8, y), f"{v:.4g}", fill="black", font=font, anchor="rm")
        for s in sigmas:
            x, _ = px({"sigma_rel": s, "score": y_lo})
            d.line([x, height - bottom, x, height - bottom + 4], fill="black")
            d.text((x, height - bottom + 8), f"{s:.3g}", fill="black", font=font, anchor="ma")
        d.text(((x0 + x1) / 2, height - 22), "post-hoc EMA length sigma_rel (log)", fill="black", anchor="mm")
        for key in keys:
            colour = colours[key]
            series = sorted((r for r in own if _series_key(r) == key), key=px)
            if len(series) > 1:
                d.line([px(r) for r in series], fill=colour, width=2 if name == "coarse" else 1)
            for r in series:
                x, y = px(r)
                if name == "coarse":
                    d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
                else:
                    d.rectangle([x - 4, y - 4, x + 4, y + 4], outline=colour, width=2)
        if name == best.get("pass") and math.isfinite(best["score"]):
            x, y = px(best)
            d.ellipse([x - 9, y - 9, x + 9, y + 9], outline="black", width=2)

    lx = width - legend_w + 16
    for i, key in enumerate(keys):
        ly = top + 14 * i + 6
        d.line([lx, ly, lx + 20, ly], fill=colours[key], width=2)
        d.text((lx + 26, ly), _series_label(key), fill="black", font=font, anchor="lm")
    ly = top + 14 * len(keys) + 14
    for i, text in enumerate(("dots: coarse pass", "squares: fine pass", "ring: best (fine pass)")):
        d.text((lx, ly + 14 * i), text, fill="black", font=font, anchor="lm")
    image.save(path, format="PNG")


def main(argv: Sequence[str] | None = None) -> int:
    """Redraw a sweep's figure from its ``points.jsonl``; 2 with one line for a malformed file."""
    from dew.sweep import grid

    parser = argparse.ArgumentParser(prog="python -m dew.sweep.plot", description=main.__doc__)
    parser.add_argument("points", help="a sweep's points.jsonl")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--metric", required=True, help="the metric's name, for the title")
    parser.add_argument("--classes", type=int, default=None, help="classes each point drew per_class of")
    parser.add_argument("--goal", choices=("min", "max"), default="min")
    args = parser.parse_args(argv)
    try:
        records = list(grid.read_points(args.points).values())
        fine = {grid.Point.from_record(r): r for r in records if r["pass"] == grid.FINE}
        if not fine:
            raise grid.SweepError(f"{args.points} holds no fine-pass point: the sweep did not finish")
    except grid.SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    best = fine[grid.ranked({q: r["score"] for q, r in fine.items()}, args.goal)[0]]
    draw_sweep(records, best, args.metric, args.out, args.classes)
    where = f"sigma_rel {best['sigma_rel']:g}"
    print(f"wrote {args.out}: {len(records)} points, best {best['score']:.6g} at {where}")
    return 0


__all__ = ["PASSES", "draw_sweep", "main", "samples_text"]

if __name__ == "__main__":
    sys.exit(main())
