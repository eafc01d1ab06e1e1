"""The sweep's figure, drawn with PIL (a dependency; matplotlib is not): the metric against the
post-hoc EMA length σ_rel on a log axis, one line per (guidance weight, interval, guide EMA)
setting through its coarse-pass points, the fine-pass points as squares and the best point
ringed, in the manner of EDM2's FID-vs-EMA-length figure (Karras et al. 2024, Fig. 5)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dew.tracking.render import PALETTE


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


def draw_sweep(records: Sequence[Mapping[str, Any]], best: Mapping[str, Any], metric: str, path: str) -> None:
    """Write the figure of ``records`` (the sweep's, coarse and fine) to the PNG ``path``."""
    from PIL import Image, ImageDraw, ImageFont

    width, height = 760, 480
    left, right, top, bottom = 80, 230, 40, 60
    image = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    finite = [r for r in records if math.isfinite(r["score"])]
    xs = [math.log(r["sigma_rel"]) for r in finite]
    ys = [r["score"] for r in finite]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    pad_x = (x_hi - x_lo) * 0.05 or 0.1
    pad_y = (y_hi - y_lo) * 0.08 or abs(y_hi) * 0.1 or 1.0
    x_lo, x_hi, y_lo, y_hi = x_lo - pad_x, x_hi + pad_x, y_lo - pad_y, y_hi + pad_y

    def px(r: Mapping[str, Any]) -> tuple[float, float]:
        x = left + (math.log(r["sigma_rel"]) - x_lo) / (x_hi - x_lo) * (width - left - right)
        y = height - bottom - (r["score"] - y_lo) / (y_hi - y_lo) * (height - top - bottom)
        return x, y

    d.rectangle([left, top, width - right, height - bottom], outline="black")
    for v in _nice_ticks(y_lo, y_hi):
        _, y = px({"sigma_rel": math.exp(x_lo), "score": v})
        d.line([left - 4, y, left, y], fill="black")
        d.line([left + 1, y, width - right - 1, y], fill=(230, 230, 230))
        d.text((left - 8, y), f"{v:.4g}", fill="black", font=font, anchor="rm")
    sigmas = sorted({r["sigma_rel"] for r in finite if r["pass"] == "coarse"})
    for s in sigmas:
        x, _ = px({"sigma_rel": s, "score": y_lo})
        d.line([x, height - bottom, x, height - bottom + 4], fill="black")
        d.text((x, height - bottom + 8), f"{s:.3g}", fill="black", font=font, anchor="ma")
    d.text(
        ((left + width - right) / 2, height - 20),
        "post-hoc EMA length sigma_rel (log)",
        fill="black",
        anchor="mm",
    )
    d.text((left, 14), f"{metric} vs EMA length", fill="black", font=font)

    keys = sorted({_series_key(r) for r in finite}, key=lambda k: (k[2] or 0.0, k[0], k[1]))
    for i, key in enumerate(keys):
        colour = PALETTE[i % len(PALETTE)]
        coarse = sorted((r for r in finite if _series_key(r) == key and r["pass"] == "coarse"), key=px)
        if len(coarse) > 1:
            d.line([px(r) for r in coarse], fill=colour, width=2)
        for r in coarse:
            x, y = px(r)
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        for r in finite:
            if _series_key(r) == key and r["pass"] == "fine":
                x, y = px(r)
                d.rectangle([x - 4, y - 4, x + 4, y + 4], outline=colour, width=2)
        ly = top + 14 * i + 6
        d.line([width - right + 12, ly, width - right + 32, ly], fill=colour, width=2)
        d.text((width - right + 38, ly), _series_label(key), fill="black", font=font, anchor="lm")
    ly = top + 14 * len(keys) + 14
    d.text((width - right + 12, ly), "dots: coarse pass", fill="black", font=font, anchor="lm")
    d.text((width - right + 12, ly + 14), "squares: fine pass", fill="black", font=font, anchor="lm")
    d.text((width - right + 12, ly + 28), "ring: best", fill="black", font=font, anchor="lm")
    if math.isfinite(best["score"]):
        x, y = px(best)
        d.ellipse([x - 9, y - 9, x + 9, y + 9], outline="black", width=2)
    image.save(path, format="PNG")
