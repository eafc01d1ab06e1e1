"""A protocol draw's tally: what ``Draw.run_tally`` accumulates chunk by chunk in seed order and
records in its progress file (``dew.scoring.progress_file``) after each, so that an interrupted
draw resumes to the same numbers. One implementation for every protocol, its files and spaces a
``Layout``: FID's (``FidTally``: the float64 ``MomentSums`` of the features, the progress file's
own ``total``/``outer`` in ``<outdir>/fid-progress.npz``) and ADM's suite's
(``dew.scoring.adm_progress.AdmTally``: the pool sums there, the spatial sums as the extra
``total_s``/``outer_s``, and each chunk's float32 pool rows as ``<outdir>/adm-pool-<chunk>.npy``
under their SHA-256 digests, ``pool_sha256``).

After each chunk (process 0) the chunk's rows file is written (a temporary file, flushed,
renamed), then the progress file, so a progress file never vouches for a rows file not yet on
disk. ``Tally.read`` refuses what ``progress_file`` refuses, and extra sums of another width or
not finite, a digest list whose length is not ``chunks_done``, or a rows file missing, not
matching its digest, or not float32 [rows of that chunk, width] of finite values
(``ProgressDamaged``, one line); ``Tally.resume`` sets such a file aside and starts over.
``pool_rows`` reads the rows again at the report against the same digests. The format's own
names (``write_progress``, ``read_progress``, ...) are public here too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import os
from typing import Any

import numpy as np

from dew.npz import HEADER_BYTES, Member, NotAnNpzError, read_npy
from dew.scoring.fid_reference import FidInputError, MomentSums
from dew.scoring.progress_file import (
    PROGRESS_FILE,
    ProgressDamaged,
    fingerprint,
    read_progress,
    read_progress_arrays,
    remove_stale_temporaries,
    set_aside,
    write_progress,
)

STATS_FILE = "fid-stats.npz"  # the finished FID draw's statistics (``protocol_results.write_results``)
REPORT_FILE = "fid.json"  # its report


@dataclasses.dataclass(frozen=True)
class Space:
    """One feature space a tally sums, its columns side by side in the detector's rows: its
    ``width`` (None: any), the ``suffix`` of its names (``total<suffix>``, ``outer<suffix>`` in
    the progress file, ``mu<suffix>``, ``sigma<suffix>`` in the statistics) and its ``name`` in
    refusals."""

    width: int | None
    suffix: str = ""
    name: str = ""


@dataclasses.dataclass(frozen=True)
class Layout:
    """A protocol's files and what its tally keeps: the feature ``spaces`` (the first one's sums
    are the progress file's own ``total``/``outer``, the others its extra arrays), the
    ``progress`` file (``what`` names it in refusals), the finished draw's ``stats`` and
    ``report`` files, and ``rows``: the name of each chunk's first-space float32 rows file
    (``str.format`` of the chunk index; None: no rows kept)."""

    what: str
    progress: str
    stats: str
    report: str
    spaces: tuple[Space, ...]
    rows: str | None = None


ROW_DIGESTS = "pool_sha256"  # the progress file's SHA-256 of each chunk's rows file


class Tally:
    """What a protocol draw accumulates chunk by chunk in seed order (``Draw.run_tally``) and
    records after each: every space's float64 ``MomentSums`` and, where the layout keeps rows,
    each chunk's first-space rows on disk under the digests its progress file records (written
    before the progress, so a progress file never vouches for a chunk file not yet on disk). Every
    process adds every chunk, process 0 alone commits. ``num`` and ``chunk`` (the draw's images
    and chunk size) are needed where rows are kept."""

    def __init__(self, layout: Layout, num: int | None = None, chunk: int | None = None):
        self.layout, self.num, self.chunk = layout, num, chunk
        self._clear()

    def _clear(self) -> None:
        self.space_sums = [MomentSums() for _ in self.layout.spaces]
        self.digests: list[str] = []
        self._pending: tuple[int, np.ndarray] | None = None  # the last chunk's rows, unwritten

    @property
    def sums(self) -> MomentSums:
        """The first space's sums (FID's; ADM's pool)."""
        return self.space_sums[0]

    @property
    def count(self) -> int:
        """Images added so far (resumed ones included)."""
        return self.sums.count

    def rows_in(self, index: int) -> int:
        """Images in chunk ``index`` (the last one may be short)."""
        assert self.num is not None and self.chunk is not None
        return min(self.chunk, self.num - index * self.chunk)

    def temporaries(self, num_chunks: int) -> tuple[str, ...]:
        """The names of the files it writes (``<name>.tmp-<pid>`` leftovers get removed)."""
        layout = self.layout
        rows = tuple(layout.rows.format(i) for i in range(num_chunks)) if layout.rows else ()
        return (layout.progress, layout.stats, layout.report, *rows)

    def add(self, index: int, features: np.ndarray) -> None:
        """Add chunk ``index``'s feature rows [n, every space's width], in seed order."""
        f = np.asarray(features, np.float32) if self.layout.rows else features
        widths = [s.width for s in self.layout.spaces]
        if self.num is not None and None not in widths:
            want = (self.rows_in(index), sum(w or 0 for w in widths))
            if f.ndim != 2 or f.shape != want:
                name = type(self).__name__
                raise ValueError(f"{name}.add: chunk {index} needs features {want}, got {f.shape}")
        start = 0
        for sums, width in zip(self.space_sums, widths, strict=True):
            sums.add(f if len(widths) == 1 else f[:, start : None if width is None else start + width])
            start += width or 0
        if self.layout.rows:
            self._pending = (index, np.ascontiguousarray(f[:, : widths[0]]))

    def commit(self, outdir: str, settings: dict[str, Any], chunks_done: int) -> None:
        """Write the state after ``chunks_done`` chunks, atomically: the last chunk's rows file
        (where kept), then the progress file."""
        extra: dict[str, np.ndarray] = {}
        for space, sums in zip(self.layout.spaces[1:], self.space_sums[1:], strict=True):
            assert sums.total is not None and sums.outer is not None, "add the chunk first"
            extra[f"total{space.suffix}"] = np.asarray(sums.total, np.float64)
            extra[f"outer{space.suffix}"] = np.asarray(sums.outer, np.float64)
        if self.layout.rows:
            assert self._pending is not None and self._pending[0] == chunks_done - 1, "add the chunk first"
            index, rows = self._pending
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(rows, np.float32), allow_pickle=False)
            _write_atomically(os.path.join(outdir, self.layout.rows.format(index)), buffer.getvalue())
            self.digests = [*self.digests[:index], hashlib.sha256(buffer.getvalue()).hexdigest()]
            extra[ROW_DIGESTS] = np.asarray(self.digests, dtype="U64")
        write_progress(outdir, settings, chunks_done, self.sums, extra=extra, name=self.layout.progress)

    def resume(self, outdir: str, settings: dict[str, Any]) -> int:
        """Take the state of ``outdir``'s progress (none: empty), the chunks done; a damaged one
        is set aside (``set_aside``) and the draw starts over; another draw's is
        ``FidInputError`` in one line."""
        try:
            return self.read(outdir, settings)
        except ProgressDamaged as e:
            set_aside(e)
            self._clear()
            return 0

    def read(self, outdir: str, settings: dict[str, Any]) -> int:
        """Take the state of ``outdir``'s progress, every rows file checked against its digest;
        the chunks done. ``ProgressDamaged`` in one line when it is damaged (module docstring),
        ``FidInputError`` when it is another draw's."""
        layout, extra = self.layout, {}
        for space in layout.spaces[1:]:
            extra[f"total{space.suffix}"] = Member("f", (space.width,))
            extra[f"outer{space.suffix}"] = Member("f", (space.width, space.width))
        if layout.rows:
            num_chunks = math.ceil(int(settings["num_images"]) / int(settings["chunk"]))
            extra[ROW_DIGESTS] = Member("U", (None,), max_bytes=num_chunks * 4 * 64)  # one a chunk
        chunks, first, arrays = read_progress_arrays(
            outdir,
            settings,
            layout.spaces[0].width,
            name=layout.progress,
            what=layout.what,
            extra=extra,
            check=lambda done, arrays: self._check(outdir, done, arrays),
        )
        self._clear()
        self.space_sums[0] = first
        for i, space in enumerate(layout.spaces[1:] if chunks else (), start=1):
            total, outer = arrays[f"total{space.suffix}"], arrays[f"outer{space.suffix}"]
            self.space_sums[i] = MomentSums(first.count, total.astype(np.float64), outer.astype(np.float64))
        self.digests = [str(d) for d in arrays.get(ROW_DIGESTS, ())]
        return chunks

    def _check(self, outdir: str, done: int, arrays: dict[str, np.ndarray]) -> str | None:
        for space in self.layout.spaces[1:]:
            if not all(np.isfinite(arrays[f"{k}{space.suffix}"]).all() for k in ("total", "outer")):
                return f"its {space.name} sums are not finite"
        if not self.layout.rows:
            return None
        digests = arrays[ROW_DIGESTS]
        if digests.shape != (done,):
            return f"{ROW_DIGESTS} holds {digests.shape} digests, expected one per chunk done ({done})"
        for index, digest in enumerate(digests):
            try:
                self._read_rows(outdir, index, str(digest))
            except FidInputError as e:
                return str(e)
        return None

    def _read_rows(self, outdir: str, index: int, digest: str) -> np.ndarray:
        """Chunk ``index``'s rows, its bytes checked against ``digest``; ``FidInputError`` (a
        reason, without the file's context) when they are not what the progress recorded."""
        assert self.layout.rows is not None
        path = os.path.join(outdir, self.layout.rows.format(index))
        want = (self.rows_in(index), self.layout.spaces[0].width)
        most = 4 * want[0] * (want[1] or 0) + HEADER_BYTES  # float32 rows and a .npy header
        try:
            with open(path, "rb") as f:
                data = f.read(most + 1)
        except OSError as e:
            raise FidInputError(f"its chunk file {path} cannot be read ({type(e).__name__})") from None
        if len(data) > most:
            raise FidInputError(f"its chunk file {path} holds more bytes than float32 {want} rows")
        if hashlib.sha256(data).hexdigest() != digest:
            raise FidInputError(f"its chunk file {path} does not match the digest recorded for it (damaged)")
        try:
            rows = read_npy(data, f"its chunk file {path}", Member("f", want))
        except NotAnNpzError as e:
            raise FidInputError(str(e)) from None
        if rows.dtype != np.float32:
            raise FidInputError(
                f"its chunk file {path} is {rows.dtype} {rows.shape}, expected float32 {want}"
            )
        if not np.isfinite(rows).all():
            raise FidInputError(f"its chunk file {path} holds values that are not finite")
        return rows

    def pool_rows(self, outdir: str) -> list[np.ndarray]:
        """Every chunk's first-space rows, in seed order, each file's bytes checked against the
        progress file's digest; ``FidInputError`` naming ``outdir`` and the file otherwise."""
        assert self.num is not None and self.chunk is not None
        num_chunks = math.ceil(self.num / self.chunk)
        if len(self.digests) != num_chunks:
            raise FidInputError(f"--outdir={outdir!r}: {len(self.digests)} of {num_chunks} chunks drawn")
        out = []
        for index, digest in enumerate(self.digests):
            try:
                out.append(self._read_rows(outdir, index, digest))
            except FidInputError as e:
                raise FidInputError(
                    f"--outdir={outdir!r}: the {self.layout.what} progress file "
                    f"{os.path.join(outdir, self.layout.progress)} is unusable: {e}; delete it to start over"
                ) from None
        return out

    def statistics(self) -> dict[str, np.ndarray]:
        """Each space's ``mu<suffix>``, ``sigma<suffix>`` (``MomentSums.mu_sigma``)."""
        out = {}
        for space, sums in zip(self.layout.spaces, self.space_sums, strict=True):
            out[f"mu{space.suffix}"], out[f"sigma{space.suffix}"] = sums.mu_sigma()
        return out


class FidTally(Tally):
    """FID's tally: the float64 sums of the detector's ``dim`` features in ``fid-progress.npz``."""

    def __init__(self, dim: int | None):
        super().__init__(Layout("FID", PROGRESS_FILE, STATS_FILE, REPORT_FILE, (Space(dim),)))
        self.dim = dim


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


__all__ = [
    "PROGRESS_FILE",
    "REPORT_FILE",
    "STATS_FILE",
    "FidTally",
    "Layout",
    "ProgressDamaged",
    "Space",
    "Tally",
    "fingerprint",
    "read_progress",
    "read_progress_arrays",
    "remove_stale_temporaries",
    "set_aside",
    "write_progress",
]
