"""scikit-learn's ``load_digits``: 1,797 real 8x8 handwritten digits that ship inside the package,
so the default run needs no download.

The digits are read from the file scikit-learn ships them in (``datasets/data/digits.csv.gz``,
found without importing scikit-learn), as ``load_digits`` reads it: importing scikit-learn takes
1-2.5 s, all of it before a run's compile can start. Where that file is not found
(another layout), ``load_digits`` itself is used.

Pixels are 0..16 in the source; they are mapped to [-1, 1] as x/8 − 1. The split is fixed
(every 10th example, 180 images, is validation) so runs are comparable.
"""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np

from dew import registry
from dew.data.dataset import Source

NUM_CLASSES = 10
SHAPE = (8, 8, 1)


def to_unit_range(pixels_0_16: np.ndarray) -> np.ndarray:
    return (pixels_0_16.astype(np.float32) / 8.0 - 1.0).reshape(-1, *SHAPE)


def to_source_range(images: np.ndarray) -> np.ndarray:
    """Inverse of ``to_unit_range``, flattened to sklearn's 64 features (for classifiers)."""
    return ((np.asarray(images, np.float32) + 1.0) * 8.0).clip(0, 16).reshape(len(images), -1)


def shipped_file() -> pathlib.Path | None:
    """Where the installed scikit-learn keeps the digits (None: not found), located without
    importing it."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        return None
    path = pathlib.Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


def load_pixels_and_labels() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits: pixels [1797, 64] (0..16, float64) and labels [1797] (int), in
    ``load_digits``' order and values."""
    path = shipped_file()
    if path is None:
        from sklearn.datasets import load_digits

        data, target = load_digits(return_X_y=True)
        return np.asarray(data), np.asarray(target)  # (arrays already: as_frame=False)
    table = np.loadtxt(path, delimiter=",")  # 64 pixel columns, then the label
    return table[:, :-1], table[:, -1].astype(int)


def digits(split: str = "train") -> Source:
    """The ``train`` (1,617) or ``validation`` (180) split of load_digits, images in [-1, 1]."""
    if split not in ("train", "validation"):
        raise ValueError(f"digits: split must be 'train' or 'validation', got {split!r}")
    pixels, labels = load_pixels_and_labels()
    held_out = np.arange(len(labels)) % 10 == 0
    rows = held_out if split == "validation" else ~held_out
    return Source(
        name=f"digits/{split}",
        fields={"image": to_unit_range(pixels[rows]), "label": labels[rows].astype(np.int32)},
        num_classes=NUM_CLASSES,
    )


WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
CAPTION_LENGTH = 32
TEMPLATES = (
    "a handwritten {word}",
    "the digit {word}",
    "{word}",
    "a {word}",
    "handwritten {digit}",
    "the number {digit}",
)
"""Caption templates; example i of a split gets template i mod 6, so every class is described
several ways, in words and in numerals."""


def captions(labels: np.ndarray) -> list[str]:
    return [
        TEMPLATES[i % len(TEMPLATES)].format(word=WORDS[c], digit=c) for i, c in enumerate(np.asarray(labels))
    ]


def digits_text(split: str = "train") -> Source:
    """``digits`` with a text caption per image: field ``text`` holds its UTF-8 byte tokens
    [N, 32] (``dew.encoding.byte_text.tokenize``); ``label`` stays for scoring."""
    from dew.encoding.byte_text import tokenize

    base = digits(split)
    text = tokenize(captions(base.fields["label"]), CAPTION_LENGTH)
    return Source(
        name=f"digits_text/{split}",
        fields={**base.fields, "text": text},
        num_classes=NUM_CLASSES,
        class_prompts=tuple(f"a handwritten {w}" for w in WORDS),
    )


registry.datasets.register("digits", digits)
registry.datasets.register("digits_text", digits_text)
