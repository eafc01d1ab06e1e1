"""The Python standard library's own source, as bytes: a text corpus every machine has offline.

Corpus: the top-level ``*.py`` files of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``, not its subpackages; 168 files, 4.7 MB on CPython 3.11.7),
sorted by file name. Split by file, fixed: file i (in that order) is held out when
``i % 10 == 0`` (``validation``, 17 files on 3.11.7), the rest is ``train``. The numbers a run
reports depend on the interpreter's version, since its library is the corpus.

Each split is one stream: its files' bytes concatenated in order. A record is a window of
``CONTEXT + 1`` bytes starting every ``CONTEXT`` bytes (consecutive windows share one byte, so
every byte but the stream's first is a target exactly once): field ``tokens`` [N, CONTEXT + 1]
(int32 byte values 0..255) and ``weights`` [N, CONTEXT] for the targets ``tokens[:, 1:]``: 0
where the target is a document's first byte (nothing before it in the same file predicts it) or
padding past the stream's end, else 1.
"""

from __future__ import annotations

import functools
import pathlib
import sysconfig

import numpy as np

from dew import registry
from dew.data.dataset import Source

CONTEXT = 128
HELD_OUT_EVERY = 10


def corpus_files() -> list[pathlib.Path]:
    """The corpus, in its fixed order (see the module docstring)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return sorted(root.glob("*.py"), key=lambda p: p.name)


def split_files(split: str) -> list[pathlib.Path]:
    if split not in ("train", "validation"):
        raise ValueError(f"python_bytes: split must be 'train' or 'validation', got {split!r}")
    files = corpus_files()
    if not files:
        raise FileNotFoundError(f"python_bytes: no *.py files under {sysconfig.get_paths()['stdlib']}")
    held_out = split == "validation"
    return [f for i, f in enumerate(files) if (i % HELD_OUT_EVERY == 0) == held_out]


@functools.lru_cache(maxsize=4)
def stream(split: str) -> tuple[np.ndarray, np.ndarray]:
    """(bytes [S] uint8, is_document_start [S] bool) of one split."""
    chunks = [np.frombuffer(f.read_bytes(), np.uint8) for f in split_files(split)]
    chunks = [c for c in chunks if c.size]
    starts = np.zeros(sum(c.size for c in chunks), bool)
    starts[np.cumsum([0] + [c.size for c in chunks[:-1]])] = True
    return np.concatenate(chunks), starts


def windows(data: np.ndarray, starts: np.ndarray, context: int = CONTEXT) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [N, context + 1] int32, weights [N, context] float32) as the module docstring says."""
    n = int(np.ceil((len(data) - 1) / context))
    index = np.arange(n)[:, None] * context + np.arange(context + 1)[None]
    valid = index < len(data)
    tokens = np.where(valid, data[np.minimum(index, len(data) - 1)], 0).astype(np.int32)
    target_valid = valid[:, 1:]
    first = starts[np.minimum(index[:, 1:], len(data) - 1)]
    weights = (target_valid & ~first).astype(np.float32)
    return tokens, weights


def python_bytes(split: str = "train") -> Source:
    """The ``train`` or ``validation`` split of the standard-library byte corpus (module docstring)."""
    tokens, weights = windows(*stream(split))
    return Source(
        name=f"python_bytes/{split}", fields={"tokens": tokens, "weights": weights}, sample_field="tokens"
    )


def unigram_bits_per_byte() -> float:
    """The baseline: a unigram byte model fitted on ``train`` (add-one smoothed counts), scored in
    bits per byte on the counted targets of ``validation`` (the weights above)."""
    train = python_bytes("train")
    counts = np.bincount(train.fields["tokens"][:, 1:][train.fields["weights"] > 0], minlength=256) + 1.0
    log_p = np.log2(counts / counts.sum())
    held = python_bytes("validation")
    targets = held.fields["tokens"][:, 1:][held.fields["weights"] > 0]
    return float(-log_p[targets].mean())


registry.datasets.register("python_bytes", python_bytes)
