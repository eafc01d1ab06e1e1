"""Artifacts as pictures and pages: the one rendering every backend shows.

- ``ImageGrid``: the tiled grid; with captions, each image gets the text it was conditioned on
  printed under it (wrapped to the cell, at most ``CAPTION_LINES`` lines).
- ``TokenScores``: each target position as a cell whose colour is its loss in bits, white (0
  bits) to red (``heat_cap`` bits and above), grey where the weight is 0; as HTML (one ``span``
  per position, the loss in its tooltip) and as a PNG of the same cells.
- ``TextSamples``: an HTML page, prompt in bold, continuation after it.
- ``Representations``: a 2-D PCA scatter, one colour per label, with a legend and each axis's
  share of the variance.

Pictures are bounded whatever the artifact holds: at most ``MAX_SCORE_ROWS`` rows of
``MAX_SCORE_POSITIONS`` positions are drawn for token scores (the HTML says how many were left
out) and the scatter is a fixed 560 x 480 pixels.
"""

from __future__ import annotations

import html
import math

import numpy as np

from dew.artifacts import ImageGrid, Representations, TextSamples, TokenScores

CAPTION_LINES = 3
MAX_SCORE_ROWS = 16
MAX_SCORE_POSITIONS = 2048
_FONT_SIZE = 11
PALETTE = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)
"""Label colours (cycled beyond ten labels)."""


def _font():
    from PIL import ImageFont

    return ImageFont.load_default(size=_FONT_SIZE)


def _scale(height: int) -> int:
    return max(1, 64 // height)


def _wrap(text: str, width_px: float, font) -> list[str]:
    """Greedy word wrap to ``width_px``; the last kept line ends in an ellipsis when cut."""
    words, lines, line = text.split(), [], ""
    for word in words:
        trial = f"{line} {word}".strip()
        if font.getlength(trial) <= width_px or not line:
            line = trial
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    if len(lines) > CAPTION_LINES:
        lines = lines[:CAPTION_LINES]
        lines[-1] = lines[-1].rstrip(".") + "…"
    for i, kept in enumerate(lines):  # one unbreakable word wider than the cell
        while font.getlength(kept) > width_px and len(kept) > 1:
            kept = kept[:-2] + "…"
        lines[i] = kept
    return lines


def image_pixels(grid: ImageGrid, scale: int | None = None) -> np.ndarray:
    """The grid as one [H, W, C] uint8 picture, enlarged if tiny; with captions, RGB with each
    image's caption under it."""
    scale = scale or _scale(grid.images.shape[1])
    pad = max(2, scale // 2)
    if grid.captions is None:
        return grid.to_uint8_grid(scale=scale, pad=pad)
    from PIL import Image, ImageDraw

    font = _font()
    n, h, w, _ = grid.images.shape
    h, w = h * scale, w * scale
    cell_w = max(w, 96)
    line_h = _FONT_SIZE + 3
    cell_h = h + CAPTION_LINES * line_h + 4
    cols = grid.grid_columns
    rows = math.ceil(n / cols)
    canvas = Image.new("RGB", (cols * (cell_w + pad) + pad, rows * (cell_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    tiles = grid.to_uint8_grid(scale=scale, pad=0)  # cut back into images below
    for i in range(n):
        r, k = divmod(i, cols)
        y, x = pad + r * (cell_h + pad), pad + k * (cell_w + pad)
        tile = tiles[r * h : (r + 1) * h, k * w : (k + 1) * w]
        image = Image.fromarray(tile[..., 0] if tile.shape[-1] == 1 else tile).convert("RGB")
        canvas.paste(image, (x + (cell_w - w) // 2, y))
        for j, line in enumerate(_wrap(grid.captions[i], cell_w - 2, font)):
            draw.text((x + 1, y + h + 2 + j * line_h), line, fill=(0, 0, 0), font=font)
    return np.asarray(canvas)


def heat_cap(scores: TokenScores) -> float:
    """The number of bits drawn fully red: the 99th percentile of counted losses, at least 1."""
    counted = scores.losses[scores.weights > 0] / math.log(2.0)
    return max(1.0, float(np.percentile(counted, 99))) if counted.size else 1.0


def heat_colour(bits: float, weight: float, cap: float) -> tuple[int, int, int]:
    """White (0 bits) to red (``cap`` bits); light grey for a weight-0 position."""
    if weight == 0:
        return (215, 215, 215)
    t = min(max(bits / cap, 0.0), 1.0)
    return (255, round(255 * (1 - t)), round(255 * (1 - t)))


def _shown(piece: str) -> str:
    """A piece as a visible glyph: newline, tab and space get symbols."""
    return piece.replace("\n", "¶").replace("\t", "→").replace(" ", "·") if piece.strip() == "" else piece


def _score_rows(scores: TokenScores) -> tuple[int, int]:
    return min(len(scores.losses), MAX_SCORE_ROWS), min(scores.losses.shape[1], MAX_SCORE_POSITIONS)


def token_scores_html(scores: TokenScores, title: str = "token scores") -> str:
    """A standalone HTML page: one line per row, each position a span coloured by its loss."""
    cap = heat_cap(scores)
    rows, width = _score_rows(scores)
    bits = scores.losses / math.log(2.0)
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:monospace} .row{white-space:pre-wrap;margin:0 0 1em 0}"
        " span{padding:0}</style></head><body>",
        f"<h3>{html.escape(title)}</h3>",
        f"<p>mean {scores.bits_per_token():.4f} bits per counted target; colour: white = 0 bits, "
        f"red = {cap:.2f} bits or more, grey = weight 0 (not counted).</p>",
    ]
    for i in range(rows):
        counted = scores.weights[i].sum()
        mean = (bits[i] * scores.weights[i]).sum() / counted if counted else float("nan")
        spans = []
        for j in range(width):
            r, g, b = heat_colour(bits[i, j], scores.weights[i, j], cap)
            piece = scores.pieces[i][j] if scores.pieces is not None else "\u2007"
            tip = f"{bits[i, j]:.3f} bits" if scores.weights[i, j] else "weight 0"
            spans.append(
                f"<span style='background:rgb({r},{g},{b})' title='{tip}'>{html.escape(piece)}</span>"
            )
        out.append(f"<div class='row'><b>row {i}: {mean:.3f} bits</b><br>{''.join(spans)}</div>")
    left = len(scores.losses) - rows, scores.losses.shape[1] - width
    if any(left):
        out.append(f"<p>not shown: {left[0]} rows, {left[1]} positions per row</p>")
    out.append("</body></html>")
    return "\n".join(out)


def token_scores_pixels(scores: TokenScores, columns: int = 96) -> np.ndarray:
    """The same cells as ``token_scores_html``, drawn: [H, W, 3] uint8, ``columns`` cells a line."""
    from PIL import Image, ImageDraw

    font = _font()
    cap = heat_cap(scores)
    rows, width = _score_rows(scores)
    bits = scores.losses / math.log(2.0)
    cell_w, cell_h = 8, _FONT_SIZE + 4
    lines_per_row = math.ceil(width / columns)
    height = rows * (lines_per_row + 1) * cell_h + cell_h
    canvas = Image.new("RGB", (columns * cell_w + 4, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    y = 2
    for i in range(rows):
        draw.text((2, y), f"row {i}", fill=(0, 0, 160), font=font)
        y += cell_h
        for j in range(width):
            line, col = divmod(j, columns)
            x0, y0 = 2 + col * cell_w, y + line * cell_h
            colour = heat_colour(bits[i, j], scores.weights[i, j], cap)
            draw.rectangle((x0, y0, x0 + cell_w - 1, y0 + cell_h - 1), fill=colour)
            if scores.pieces is not None:
                glyph = _shown(scores.pieces[i][j])[:1]
                draw.text((x0 + 1, y0 + 1), glyph, fill=(0, 0, 0), font=font)
        y += lines_per_row * cell_h
    return np.asarray(canvas)


def text_html(samples: TextSamples, title: str = "text samples") -> str:
    """A standalone HTML page: one block per sample, its prompt in bold before the text."""
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:monospace} .s{white-space:pre-wrap;border-bottom:1px solid #ccc;"
        "padding:0.5em 0}</style></head><body>",
        f"<h3>{html.escape(title)}</h3>",
    ]
    texts = samples.text if samples.text is not None else samples.to_lines()
    for i, (text, prompt) in enumerate(zip(texts, samples.prompts(), strict=True)):
        shown = f"<b>{html.escape(prompt)}</b>" if prompt else ""
        out.append(f"<div class='s'>{i}: {shown}{html.escape(text)}</div>")
    out.append("</body></html>")
    return "\n".join(out)


def representations_pixels(reps: Representations, title: str = "representations") -> np.ndarray:
    """A 2-D PCA scatter of the features, coloured by label, with a legend: [480, 560, 3] uint8."""
    from PIL import Image, ImageDraw

    font = _font()
    points, explained = reps.pca_2d()
    width, height, margin, legend = 560, 480, 36, 80
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    box = (margin, margin, width - legend, height - margin)
    draw.rectangle(box, outline=(0, 0, 0))
    lo, hi = points.min(axis=0), points.max(axis=0)
    span = np.where(hi - lo > 0, hi - lo, 1.0)
    inner = np.array([box[2] - box[0] - 12, box[3] - box[1] - 12], np.float64)
    xy = (points - lo) / span * inner + np.array([box[0] + 6, box[1] + 6])
    xy[:, 1] = box[3] + box[1] - xy[:, 1]  # y up
    labels = reps.labels
    for (x, y), label in zip(xy, labels, strict=True):
        draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=PALETTE[int(label) % len(PALETTE)])
    draw.text(
        (margin, 8),
        f"{title}: PCA of {reps.features.shape[1]}-d features, N={len(labels)}",
        font=font,
        fill=(0, 0, 0),
    )
    draw.text(
        (margin, height - margin + 8), f"PC1 ({explained[0]:.0%} of variance)", font=font, fill=(0, 0, 0)
    )
    draw.text((4, margin - 14), f"PC2 ({explained[1]:.0%})", font=font, fill=(0, 0, 0))
    for k, label in enumerate(np.unique(labels)[:24]):
        y = margin + k * 16
        draw.rectangle(
            (width - legend + 10, y, width - legend + 20, y + 10), fill=PALETTE[int(label) % len(PALETTE)]
        )
        draw.text((width - legend + 26, y - 1), f"label {int(label)}", font=font, fill=(0, 0, 0))
    return np.asarray(canvas)
