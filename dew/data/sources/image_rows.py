"""The rows of an image data set as NVlabs/edm's ``training/dataset.py`` ``Dataset`` lays them out,
read as dew batches: float32 [rows, H, W, C] in [-1, 1].

The reference keeps the images as uint8 and builds two per-row arrays: ``raw_index`` (which stored
image a row shows) and ``mirrored`` (whether the row is that image flipped left-right).
``max_size`` keeps a seeded random subset of the stored images (in stored order); ``xflip`` then
doubles the rows: rows ``n .. 2n-1`` are rows ``0 .. n-1`` mirrored. ``reference_rows`` builds both
arrays as the reference does; ``ImageRows`` is a ``Source`` field over them whose ``rows`` lookup
gathers the uint8 pixels (from an in-memory table, or through a reader that decodes them),
mirrors the flagged rows and maps ``u8 / 127.5 - 1`` in float32, the training loop's conversion.

With an in-memory table a batch costs one gather, one flip of the mirrored rows and one
conversion: no decoding. ``decode_all`` fills such a table once, on a pool of threads.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable
from typing import Any

import numpy as np

#: ``read(raw_indices) -> uint8 [k, H, W, C]``: stored images decoded on demand.
Reader = Callable[[np.ndarray], np.ndarray]


def reference_rows(
    stored: int, *, max_size: int | None = None, seed: int = 0, xflip: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(raw_index int64 [rows], mirrored bool [rows])`` as NVlabs/edm's ``Dataset`` builds them
    for ``stored`` images: ``max_size`` (None: all) keeps the first ``max_size`` of a
    ``RandomState(seed mod 2**31)`` shuffle, sorted back into stored order; then ``xflip``
    appends every kept row again, mirrored."""
    if stored < 1:
        raise ValueError(f"reference_rows: stored must be >= 1, got {stored}")
    if max_size is not None and max_size < 1:
        raise ValueError(f"max_size must be None (no limit) or an int >= 1, got {max_size}")
    raw = np.arange(stored, dtype=np.int64)
    if max_size is not None and raw.size > max_size:
        np.random.RandomState(seed % (1 << 31)).shuffle(raw)
        raw = np.sort(raw[:max_size])
    mirrored = np.zeros(raw.size, dtype=bool)
    if xflip:
        raw = np.tile(raw, 2)
        mirrored = np.concatenate([mirrored, np.ones_like(mirrored)])
    return raw, mirrored


def to_unit_range(pixels: np.ndarray) -> np.ndarray:
    """uint8 -> float32 ``pixels / 127.5 - 1`` (each operation rounded in float32, as the
    reference's ``images.to(torch.float32) / 127.5 - 1``)."""
    out = np.divide(pixels, np.float32(127.5), dtype=np.float32)
    out -= np.float32(1.0)
    return out


class ImageRows:
    """One ``Source`` field: ``rows[index]`` -> float32 [k, H, W, C] in [-1, 1].

    ``pixels`` is either the stored images in memory (uint8 [stored, H, W, C]) or a ``Reader``
    that decodes the requested stored images (then ``shape`` gives their [H, W, C]). Row ``i``
    shows stored image ``raw_index[i]``, mirrored left-right where ``mirrored[i]``. Behaves as an
    array for ``Dataset``: ``shape``, ``dtype``, ``len`` and indexing by an index array (or any
    numpy index over the rows). ``cached`` says whether a lookup is a gather from memory.
    """

    def __init__(
        self,
        pixels: np.ndarray | Reader,
        raw_index: np.ndarray,
        mirrored: np.ndarray,
        *,
        shape: tuple[int, int, int] | None = None,
    ):
        raw_index, mirrored = np.asarray(raw_index, np.int64), np.asarray(mirrored, bool)
        if raw_index.shape != mirrored.shape or raw_index.ndim != 1:
            raise ValueError(f"ImageRows: raw_index {raw_index.shape} and mirrored {mirrored.shape} differ")
        if isinstance(pixels, np.ndarray):
            if pixels.dtype != np.uint8 or pixels.ndim != 4:
                raise ValueError(
                    f"ImageRows: pixels must be uint8 [N, H, W, C], got {pixels.dtype} {pixels.shape}"
                )
            shape = pixels.shape[1:]
        elif shape is None or len(shape) != 3:
            raise ValueError(f"ImageRows: a reader needs the image shape (H, W, C), got {shape}")
        self._pixels, self._raw, self._mirrored = pixels, raw_index, mirrored
        self.shape = (raw_index.size, *(int(s) for s in shape))
        self.dtype = np.dtype(np.float32)

    @property
    def cached(self) -> bool:
        return isinstance(self._pixels, np.ndarray)

    def __len__(self) -> int:
        return self.shape[0]

    def uint8(self, index: Any) -> np.ndarray:
        """The rows at ``index`` as uint8 [k, H, W, C], mirrored where flagged (what the
        reference's ``__getitem__`` returns, in HWC instead of CHW)."""
        rows = np.arange(self.shape[0])[index] if np.asarray(index).dtype.kind not in "iu" else index
        rows = np.asarray(rows, np.intp).reshape(-1)
        raw = self._raw[rows]  # also the bounds check
        source = self._pixels  # the table (cached) or a reader of rows
        pixels = np.take(source, raw, axis=0) if isinstance(source, np.ndarray) else source(raw)
        if pixels.shape[1:] != self.shape[1:] or pixels.dtype != np.uint8:
            raise ValueError(
                f"ImageRows: read {pixels.dtype} {pixels.shape[1:]}, expected uint8 {self.shape[1:]}"
            )
        flip = np.flatnonzero(self._mirrored[rows])
        if flip.size:
            if not self.cached:  # np.take already copied; a reader's array may be shared
                pixels = np.array(pixels)
            # Whole pixels as one element each: reversing W then moves C bytes at a time (~2x
            # faster than reversing a [.., W, C] uint8 view, whose inner loop is C elements long).
            texels = np.ascontiguousarray(pixels).view(np.dtype((np.void, pixels.shape[-1])))
            texels[flip] = texels[flip, :, ::-1]
            pixels = texels.view(np.uint8).reshape(pixels.shape)
        return pixels

    def __getitem__(self, index: Any) -> np.ndarray:
        return to_unit_range(self.uint8(index))


def decode_all(
    count: int, read_one: Callable[[int], np.ndarray], shape: tuple[int, ...], workers: int = 0
) -> np.ndarray:
    """uint8 [count, *shape]: ``read_one(i)`` for every i, on ``workers`` threads (0: up to 8, one
    per core). ``read_one`` must be safe to call from several threads; what it raises is raised
    here (the first failure in index order)."""
    table = np.empty((count, *shape), np.uint8)
    workers = workers or max(1, min(8, os.cpu_count() or 1))
    chunks = np.array_split(np.arange(count), max(1, min(count, workers * 8)))

    def fill(chunk: np.ndarray) -> None:
        for i in chunk:
            table[i] = read_one(int(i))

    if workers == 1:
        for chunk in chunks:
            fill(chunk)
        return table
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="dew-decode") as pool:
        for done in [pool.submit(fill, chunk) for chunk in chunks]:
            done.result()
    return table
