"""What an objective hands to a person: typed, validated media, independent of any backend.

Every artifact checks what it holds when it is built: the rank and shape of each array, its
dtype and its range. A bad field raises ``ValueError`` (``TypeError`` for a wrong dtype) naming
the artifact, the field, what was received and what is expected, so a preview that would draw
garbage fails where it was made rather than in a tracker's worker. Each artifact is bounded in
size (``LIMITS``): a preview is something a person looks at, not a data dump, and a bound keeps
an accidental full-dataset artifact from filling a disk or a tracker's store.

How each backend writes them (PNG grid with captions, animated GIF, text/HTML, heat-coloured
token scores, a PCA scatter of representations) lives with the backends,
``dew.tracking``; the pure-array views they share (tiles, PCA) live here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

LIMITS = {
    "values": 1 << 24,  # float values in an ImageGrid / VideoGrid (64 MiB as float32)
    "items": 1024,  # images, clips, text rows, token-score rows
    "frames": 256,  # frames per clip
    "text_chars": 20_000,  # characters in one caption, text sample or prompt
    "tokens": 1 << 20,  # token positions in TextSamples / TokenScores
    "records": 1 << 16,  # rows of Representations
    "features": 4096,  # feature width of Representations
}
"""Upper bounds on what one artifact holds (see the module docstring)."""

_RANGE_SLACK = 1e-3  # float32 round-off of a model output that was clipped to [-1, 1] upstream


def _fail(artifact: str, field: str, got: str, expected: str, kind: type[Exception] = ValueError):
    raise kind(f"{artifact}.{field}: got {got}, expected {expected}")


def _array(artifact: str, field: str, value: Any) -> np.ndarray:
    try:
        return np.asarray(value)
    except Exception as e:  # ragged lists and the like
        _fail(artifact, field, f"{type(value).__name__} that is not an array ({e})", "an array")
        raise AssertionError from e  # unreachable; _fail raises


def _floats(artifact: str, field: str, value: Any, rank: int, layout: str) -> np.ndarray:
    """A real floating array of the given rank, returned as float32."""
    x = _array(artifact, field, value)
    if x.ndim != rank:
        _fail(artifact, field, f"shape {x.shape} (rank {x.ndim})", f"rank {rank}: {layout}")
    if x.dtype.kind != "f":
        _fail(artifact, field, f"dtype {x.dtype}", "a floating dtype (float16/32/64)", TypeError)
    return x.astype(np.float32)


def _ints(artifact: str, field: str, value: Any, rank: int, layout: str) -> np.ndarray:
    x = _array(artifact, field, value)
    if x.ndim != rank:
        _fail(artifact, field, f"shape {x.shape} (rank {x.ndim})", f"rank {rank}: {layout}")
    if x.dtype.kind not in "iu":
        _fail(artifact, field, f"dtype {x.dtype}", "an integer dtype", TypeError)
    return x.astype(np.int64)


def _unit_range(artifact: str, field: str, x: np.ndarray) -> None:
    if x.size == 0:
        _fail(artifact, field, f"shape {x.shape} (empty)", "at least one element")
    finite = np.isfinite(x)
    if not finite.all():
        _fail(artifact, field, f"{int((~finite).sum())} non-finite values", "finite values in [-1, 1]")
    lo, hi = float(x.min()), float(x.max())
    if lo < -1.0 - _RANGE_SLACK or hi > 1.0 + _RANGE_SLACK:
        _fail(artifact, field, f"values in [{lo:.4g}, {hi:.4g}]", "values in [-1, 1] (clip samples first)")


def _bound(artifact: str, field: str, count: int, limit_key: str, what: str) -> None:
    if count > LIMITS[limit_key]:
        _fail(artifact, field, f"{count} {what}", f"at most {LIMITS[limit_key]} (dew.artifacts.LIMITS)")


def _strings(artifact: str, field: str, value: Any, count: int | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        _fail(artifact, field, "a single str", "a sequence of str, one per row")
    rows = tuple(value)
    for i, s in enumerate(rows):
        if not isinstance(s, str):
            _fail(artifact, f"{field}[{i}]", f"{type(s).__name__} {s!r}", "str", TypeError)
        _bound(artifact, f"{field}[{i}]", len(s), "text_chars", "characters")
    if count is not None and len(rows) != count:
        _fail(artifact, field, f"{len(rows)} entries", f"one per row ({count})")
    return rows


def _to_uint8(x: np.ndarray) -> np.ndarray:
    """[-1, 1] floats to [0, 255] bytes, rounded."""
    return np.clip((x + 1.0) * 127.5 + 0.5, 0, 255).astype(np.uint8)


def _tile(pixels: np.ndarray, cols: int, pad: int) -> np.ndarray:
    """[N, H, W, C] uint8 to one [H', W', C] grid, ``cols`` wide, grey gutters ``pad`` wide."""
    n, h, w, c = pixels.shape
    rows = int(np.ceil(n / cols))
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 128, np.uint8)
    for i in range(n):
        r, k = divmod(i, cols)
        y, x = pad + r * (h + pad), pad + k * (w + pad)
        grid[y : y + h, x : x + w] = pixels[i]
    return grid


@dataclasses.dataclass(frozen=True)
class ImageGrid:
    """Images in [-1, 1], [N, H, W, C] (C = 1 or 3, floating), with the text each was
    conditioned on where there was any (``captions``, one str per image). ``columns`` sets the
    grid width (e.g. one row per class). Bounded: at most ``LIMITS["items"]`` images and
    ``LIMITS["values"]`` values."""

    images: np.ndarray
    captions: tuple[str, ...] | None = None
    columns: int | None = None

    def __post_init__(self) -> None:
        name = "ImageGrid"
        images = _floats(name, "images", self.images, 4, "[N, H, W, C] with C in (1, 3)")
        if images.shape[-1] not in (1, 3) or 0 in images.shape:
            _fail(name, "images", f"shape {images.shape}", "[N, H, W, C] with N, H, W >= 1 and C in (1, 3)")
        _bound(name, "images", len(images), "items", "images")
        _bound(name, "images", images.size, "values", "values")
        _unit_range(name, "images", images)
        captions = _strings(name, "captions", self.captions, len(images))
        if self.columns is not None and not (isinstance(self.columns, int) and self.columns >= 1):
            _fail(name, "columns", repr(self.columns), "a positive int or None")
        object.__setattr__(self, "images", images)
        object.__setattr__(self, "captions", captions)

    @property
    def grid_columns(self) -> int:
        return self.columns or int(np.ceil(np.sqrt(len(self.images))))

    def to_uint8_grid(self, scale: int = 1, pad: int = 1) -> np.ndarray:
        """Tile into one [H', W', C] uint8 picture; ``scale`` enlarges pixels for tiny images."""
        pixels = _to_uint8(self.images).repeat(scale, axis=1).repeat(scale, axis=2)
        return _tile(pixels, self.grid_columns, pad)


@dataclasses.dataclass(frozen=True)
class VideoGrid:
    """Clips in [-1, 1], [N, T, H, W, C] (C = 1 or 3, floating), played at ``fps`` (1-60).
    Bounded: at most ``LIMITS["items"]`` clips of ``LIMITS["frames"]`` frames and
    ``LIMITS["values"]`` values."""

    clips: np.ndarray
    fps: int = 8

    def __post_init__(self) -> None:
        name = "VideoGrid"
        clips = _floats(name, "clips", self.clips, 5, "[N, T, H, W, C] with C in (1, 3)")
        if clips.shape[-1] not in (1, 3) or 0 in clips.shape:
            _fail(name, "clips", f"shape {clips.shape}", "[N, T, H, W, C] with N, T, H, W >= 1, C in (1, 3)")
        _bound(name, "clips", len(clips), "items", "clips")
        _bound(name, "clips", clips.shape[1], "frames", "frames")
        _bound(name, "clips", clips.size, "values", "values")
        _unit_range(name, "clips", clips)
        if not (isinstance(self.fps, int) and 1 <= self.fps <= 60):
            _fail(name, "fps", repr(self.fps), "an int in [1, 60]")
        object.__setattr__(self, "clips", clips)

    def to_uint8_frames(self, scale: int = 1, pad: int = 1) -> np.ndarray:
        """The clips side by side, one tiled [T, H', W', C] uint8 frame per time step."""
        n, t, _, _, _ = self.clips.shape
        cols = int(np.ceil(np.sqrt(n)))
        pixels = _to_uint8(self.clips).repeat(scale, axis=2).repeat(scale, axis=3)
        return np.stack([_tile(pixels[:, i], cols, pad) for i in range(t)])


@dataclasses.dataclass(frozen=True)
class TextSamples:
    """Generated token rows [N, L] (integer ids >= 0), with optional decoded ``text`` (one str
    per row) and ``prompt``: one str shared by every row, or one per row. Bounded: at most
    ``LIMITS["items"]`` rows and ``LIMITS["tokens"]`` tokens."""

    tokens: np.ndarray
    text: tuple[str, ...] | None = None
    prompt: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        name = "TextSamples"
        tokens = _ints(name, "tokens", self.tokens, 2, "[N, L]")
        _bound(name, "tokens", len(tokens), "items", "rows")
        _bound(name, "tokens", tokens.size, "tokens", "tokens")
        if tokens.size and tokens.min() < 0:
            _fail(name, "tokens", f"minimum id {tokens.min()}", "token ids >= 0")
        text = _strings(name, "text", self.text, len(tokens))
        prompt = self.prompt
        if isinstance(prompt, str):
            _bound(name, "prompt", len(prompt), "text_chars", "characters")
        elif prompt is not None:
            prompt = _strings(name, "prompt", prompt, len(tokens))
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "prompt", prompt)

    def prompts(self) -> list[str | None]:
        """The prompt of each row (None where there is none)."""
        if self.prompt is None or isinstance(self.prompt, str):
            return [self.prompt] * len(self.tokens)
        return list(self.prompt)

    def to_lines(self) -> list[str]:
        """One line per sample: the decoded text where there is some, else the token ids."""
        if self.text is not None:
            return [t.replace("\n", "⏎") for t in self.text]
        return [" ".join(str(int(t)) for t in row) for row in self.tokens]

    def to_text(self) -> str:
        """A plain-text report: the shared prompt (if any), then one numbered line per sample
        (each with its own prompt in brackets when prompts differ per row)."""
        head = [f"prompt: {self.prompt}", ""] if isinstance(self.prompt, str) else []
        lines = []
        for i, (line, prompt) in enumerate(zip(self.to_lines(), self.prompts(), strict=True)):
            per_row = isinstance(self.prompt, tuple) and prompt is not None  # a tuple holds str only
            shown = f"[{prompt.replace(chr(10), '⏎')}] " if per_row and prompt is not None else ""
            lines.append(f"{i}: {shown}{line}")
        return "\n".join(head + lines) + "\n"


@dataclasses.dataclass(frozen=True)
class TokenScores:
    """Teacher-forced per-token losses [N, L] (nats, finite, >= 0) and the weight of each
    target [N, L]: 1 where it counts, 0 where it is padding or a document's first token.

    ``pieces`` (optional) is what each position shows when drawn: N rows of L strings (e.g. the
    byte each target is). Bounded: at most ``LIMITS["items"]`` rows and ``LIMITS["tokens"]``
    positions."""

    losses: np.ndarray
    weights: np.ndarray
    pieces: tuple[tuple[str, ...], ...] | None = None

    def __post_init__(self) -> None:
        name = "TokenScores"
        losses = _floats(name, "losses", self.losses, 2, "[N, L]")
        weights = _array(name, "weights", self.weights)
        if weights.shape != losses.shape:
            _fail(name, "weights", f"shape {weights.shape}", f"the shape of losses, {losses.shape}")
        if weights.dtype.kind not in "biuf":
            _fail(name, "weights", f"dtype {weights.dtype}", "bool, integer or floating 0/1", TypeError)
        if not np.isin(weights, (0, 1)).all():
            odd = np.unique(weights[~np.isin(weights, (0, 1))])[:5]
            _fail(name, "weights", f"values {odd.tolist()}", "only 0 and 1")
        _bound(name, "losses", len(losses), "items", "rows")
        _bound(name, "losses", losses.size, "tokens", "positions")
        if not np.isfinite(losses).all():
            _fail(name, "losses", f"{int((~np.isfinite(losses)).sum())} non-finite values", "finite losses")
        if losses.size and losses.min() < 0:
            _fail(name, "losses", f"minimum {float(losses.min()):.4g}", "losses >= 0 (nats)")
        pieces = self.pieces
        if pieces is not None:
            pieces = tuple(tuple(row) for row in pieces)
            if len(pieces) != losses.shape[0] or any(len(r) != losses.shape[1] for r in pieces):
                got = f"{len(pieces)} rows of lengths {sorted({len(r) for r in pieces})}"
                _fail(name, "pieces", got, f"{losses.shape[0]} rows of {losses.shape[1]} strings")
            if not all(isinstance(p, str) for r in pieces for p in r):
                _fail(name, "pieces", "a non-str entry", "str entries", TypeError)
        object.__setattr__(self, "losses", losses)
        object.__setattr__(self, "weights", weights.astype(np.float32))
        object.__setattr__(self, "pieces", pieces)

    def mean_loss(self) -> float:
        """The weighted mean loss (nats per counted target); NaN when no target counts."""
        total = float(self.weights.sum())
        return float((self.losses * self.weights).sum() / total) if total else float("nan")

    def bits_per_token(self) -> float:
        return self.mean_loss() / float(np.log(2.0))


@dataclasses.dataclass(frozen=True)
class Representations:
    """Encoder outputs [N, D] (floating, finite) and the integer labels [N] (>= 0) of the
    records they came from, for a probe to score. Bounded: at most ``LIMITS["records"]`` rows
    of ``LIMITS["features"]`` features."""

    features: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        name = "Representations"
        features = _floats(name, "features", self.features, 2, "[N, D]")
        labels = _ints(name, "labels", self.labels, 1, "[N]")
        if len(labels) != len(features):
            _fail(name, "labels", f"{len(labels)} labels", f"one per feature row ({len(features)})")
        if len(features) < 2 or features.shape[1] < 1:
            _fail(name, "features", f"shape {features.shape}", "[N, D] with N >= 2 and D >= 1")
        _bound(name, "features", len(features), "records", "rows")
        _bound(name, "features", features.shape[1], "features", "features per row")
        if not np.isfinite(features).all():
            _fail(name, "features", f"{int((~np.isfinite(features)).sum())} non-finite values", "finite")
        if labels.min() < 0:
            _fail(name, "labels", f"minimum {labels.min()}", "labels >= 0")
        object.__setattr__(self, "features", features)
        object.__setattr__(self, "labels", labels)

    def pca_2d(self) -> tuple[np.ndarray, np.ndarray]:
        """The features projected onto their first two principal components: ([N, 2] points,
        [2] fraction of the variance each explains). Computed in float64 with an SVD of the
        centred features; each component's sign is fixed (its largest loading positive) so
        the picture does not flip between calls."""
        x = self.features.astype(np.float64)
        x = x - x.mean(axis=0)
        _, s, vt = np.linalg.svd(x, full_matrices=False)
        components = vt[:2]
        if components.shape[0] < 2:  # D == 1: the second axis is empty
            components = np.concatenate([components, np.zeros_like(components)])
            s = np.concatenate([s, [0.0]])
        signs = np.sign(components[np.arange(2), np.abs(components).argmax(axis=1)])
        components = components * np.where(signs == 0, 1.0, signs)[:, None]
        variance = s**2
        explained = variance[:2] / variance.sum() if variance.sum() > 0 else np.zeros(2)
        return x @ components.T, explained
