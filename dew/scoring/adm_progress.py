"""ADM's evaluation suite inside the FID protocol (``dew.scoring.fid_protocol``): what each chunk
of a draw adds, and the files that let an interrupted draw resume to the same numbers.

The protocol's detector for the suite (``adm_detector``) gives, per image, ``pool_3`` [2048]
and ``mixed_6/conv[..., :7]`` flattened [2023] (``dew.scoring.inception.adm_features``, the
images fed at their own size through the graph's TF1 resize), side by side as one row [4071].
``AdmTally`` accumulates, chunk by chunk in seed order:

* the float64 ``MomentSums`` of the pool features (FID) and of the spatial features (sFID);
* the chunk's float32 pool rows as ``<outdir>/adm-pool-<chunk>.npy`` (a plain ``.npy``, read
  back without pickle): precision and recall need every sample's row, and the Inception Score's
  softmax is a function of the row (``softmax(pool · Wᵀ)``), so it is computed from them at the
  end rather than stored.

After each chunk (process 0), the chunk's rows are written (a temporary file, flushed, renamed)
and then ``<outdir>/adm-progress.npz``: ``dew.scoring.fid_progress``'s layout for the pool sums
plus ``total_s``, ``outer_s`` (the spatial sums) and ``pool_sha256`` (the SHA-256 of each chunk
file's bytes, one per chunk done), all under its digest. A progress file therefore never vouches
for a chunk file not yet on disk; one left beyond ``chunks_done`` by a killed draw is rewritten.

``read`` refuses, in one line naming the file and ending "delete it to start over", a progress
file damaged or inconsistent as ``fid_progress`` defines it, spatial sums of another width or not
finite, a digest list whose length is not ``chunks_done``, and a chunk file that is missing,
whose bytes do not hash to the recorded digest, or that is not float32 [rows of that chunk,
2048] of finite values (``ProgressDamaged``); ``resume`` (what a draw calls) sets such a file
aside, saying so in one line, and the draw starts over: a damaged file dew wrote never stops a
run. ``pool_rows`` reads the rows again at the report, checking each file's
bytes against the same digests: the numbers reported come only from files the progress vouches
for, so an interrupted and rerun draw reports exactly what an uninterrupted one does.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from typing import Any

import numpy as np

from dew.npz import HEADER_BYTES, Member, NotAnNpzError, read_npy
from dew.scoring.adm_evaluator import POOL_DIM, SPATIAL_DIM
from dew.scoring.fid_progress import ProgressDamaged, read_progress_arrays, set_aside, write_progress
from dew.scoring.fid_reference import Detector, FidInputError, MomentSums

PROGRESS_FILE = "adm-progress.npz"
REPORT_FILE = "adm.json"  # the report (``dew.scoring.adm_protocol``)
STATS_FILE = "adm-stats.npz"  # the samples' statistics in ADM's reference-batch layout
DIM = POOL_DIM + SPATIAL_DIM


def chunk_file(index: int) -> str:
    """The name of chunk ``index``'s pool rows in the draw's ``outdir``."""
    return f"adm-pool-{index:05d}.npy"


def adm_detector(params: Any, weights_digest: str) -> Detector:
    """The protocol's detector for ADM's suite: uint8 images [n, H, W, 3] -> [n, 4071] float32,
    ``pool_3`` [2048] then ``mixed_6/conv[..., :7]`` flattened [2023], with the FID Inception's
    ``params`` (whose content digest is ``weights_digest``)."""

    def fn(p: Any, images: Any) -> Any:
        import jax.numpy as jnp

        from dew.scoring import inception

        pool, spatial = inception.adm_features(p, images.astype(jnp.float32))
        return jnp.concatenate([pool, spatial], axis=-1)

    description = (
        "dew inception_fid 2015-12-05 (ADM: pool_3, mixed_6/conv[..., :7]), image handling tf1, "
        f"weights sha256 {weights_digest}"
    )
    return Detector(fn, params, DIM, description)


def _npy_bytes(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(rows, np.float32), allow_pickle=False)
    return buffer.getvalue()


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class AdmTally:
    """ADM's tally for ``Draw.run_tally`` (module docstring): pool and spatial sums in memory,
    each chunk's pool rows on disk under the digests the progress file records."""

    def __init__(self, num: int, chunk: int):
        self.num, self.chunk = num, chunk
        self.pool_sums, self.spatial_sums = MomentSums(), MomentSums()
        self.digests: list[str] = []
        self._pending: tuple[int, np.ndarray] | None = None  # the last chunk's pool rows, unwritten

    @property
    def count(self) -> int:
        return self.pool_sums.count

    def rows_in(self, index: int) -> int:
        """Images in chunk ``index`` (the last one may be short)."""
        return min(self.chunk, self.num - index * self.chunk)

    def temporaries(self, num_chunks: int) -> tuple[str, ...]:
        return (PROGRESS_FILE, STATS_FILE, REPORT_FILE, *(chunk_file(i) for i in range(num_chunks)))

    def add(self, index: int, features: np.ndarray) -> None:
        f = np.asarray(features, np.float32)
        if f.ndim != 2 or f.shape[1] != DIM or len(f) != self.rows_in(index):
            want = (self.rows_in(index), DIM)
            raise ValueError(f"AdmTally.add: chunk {index} needs features {want}, got {f.shape}")
        pool = np.ascontiguousarray(f[:, :POOL_DIM])
        self.pool_sums.add(pool)
        self.spatial_sums.add(f[:, POOL_DIM:])
        self._pending = (index, pool)

    def commit(self, outdir: str, settings: dict[str, Any], chunks_done: int) -> None:
        assert self._pending is not None and self._pending[0] == chunks_done - 1, "add the chunk first"
        index, pool = self._pending
        data = _npy_bytes(pool)
        _write_atomically(os.path.join(outdir, chunk_file(index)), data)
        self.digests = [*self.digests[:index], hashlib.sha256(data).hexdigest()]
        assert self.spatial_sums.total is not None and self.spatial_sums.outer is not None  # added
        extra = {
            "total_s": np.asarray(self.spatial_sums.total, np.float64),
            "outer_s": np.asarray(self.spatial_sums.outer, np.float64),
            "pool_sha256": np.asarray(self.digests, dtype="U64"),
        }
        write_progress(outdir, settings, chunks_done, self.pool_sums, extra=extra, name=PROGRESS_FILE)

    def resume(self, outdir: str, settings: dict[str, Any]) -> int:
        """``read``, a damaged progress file set aside (``fid_progress.set_aside``) and the draw
        started over; another draw's is ``FidInputError`` in one line."""
        try:
            return self.read(outdir, settings)
        except ProgressDamaged as e:
            set_aside(e)
            self.pool_sums, self.spatial_sums, self.digests, self._pending = (
                MomentSums(),
                MomentSums(),
                [],
                None,
            )
            return 0

    def read(self, outdir: str, settings: dict[str, Any]) -> int:
        """Take the state of ``outdir/adm-progress.npz``, every chunk file checked against its
        digest (module docstring); the chunks done. ``ProgressDamaged`` (a ``FidInputError``) in
        one line when it is damaged, ``FidInputError`` when it is another draw's."""
        num_chunks = math.ceil(self.num / self.chunk)
        chunks, pool_sums, extra = read_progress_arrays(
            outdir,
            settings,
            POOL_DIM,
            name=PROGRESS_FILE,
            what="ADM",
            extra={
                "total_s": Member("f", (SPATIAL_DIM,)),
                "outer_s": Member("f", (SPATIAL_DIM, SPATIAL_DIM)),
                "pool_sha256": Member("U", (None,), max_bytes=num_chunks * 4 * 64),  # a digest a chunk
            },
            check=lambda done, arrays: self._check(outdir, done, arrays),
        )
        self.pool_sums = pool_sums
        if chunks:
            total_s, outer_s = extra["total_s"], extra["outer_s"]
            self.spatial_sums = MomentSums(
                pool_sums.count, total_s.astype(np.float64), outer_s.astype(np.float64)
            )
            self.digests = [str(d) for d in extra["pool_sha256"]]
        else:
            self.spatial_sums, self.digests = MomentSums(), []
        self._pending = None
        return chunks

    def _check(self, outdir: str, done: int, arrays: dict[str, np.ndarray]) -> str | None:
        if not (np.isfinite(arrays["total_s"]).all() and np.isfinite(arrays["outer_s"]).all()):
            return "its spatial sums are not finite"
        digests = arrays["pool_sha256"]
        if digests.shape != (done,):
            return f"pool_sha256 holds {digests.shape} digests, expected one per chunk done ({done})"
        for index, digest in enumerate(digests):
            try:
                self._read_chunk(outdir, index, str(digest))
            except FidInputError as e:
                return str(e)
        return None

    def _read_chunk(self, outdir: str, index: int, digest: str) -> np.ndarray:
        """Chunk ``index``'s pool rows, its bytes checked against ``digest``; ``FidInputError``
        (a reason, without the file's context) when they are not what the progress recorded."""
        path = os.path.join(outdir, chunk_file(index))
        try:
            with open(path, "rb") as f:  # float32 rows of the chunk and a .npy header, no more
                data = f.read(4 * self.rows_in(index) * POOL_DIM + HEADER_BYTES + 1)
        except OSError as e:
            raise FidInputError(f"its chunk file {path} cannot be read ({type(e).__name__})") from None
        if len(data) > 4 * self.rows_in(index) * POOL_DIM + HEADER_BYTES:
            raise FidInputError(
                f"its chunk file {path} holds more bytes than float32 {(self.rows_in(index), POOL_DIM)} rows"
            )
        if hashlib.sha256(data).hexdigest() != digest:
            raise FidInputError(f"its chunk file {path} does not match the digest recorded for it (damaged)")
        want = (self.rows_in(index), POOL_DIM)
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
        """Every chunk's pool rows, in seed order, each file's bytes checked against the
        progress file's digest; ``FidInputError`` naming ``outdir`` and the file otherwise."""
        num_chunks = math.ceil(self.num / self.chunk)
        if len(self.digests) != num_chunks:
            raise FidInputError(f"--outdir={outdir!r}: {len(self.digests)} of {num_chunks} chunks drawn")
        out = []
        for index, digest in enumerate(self.digests):
            try:
                out.append(self._read_chunk(outdir, index, digest))
            except FidInputError as e:
                raise FidInputError(
                    f"--outdir={outdir!r}: the ADM progress file {os.path.join(outdir, PROGRESS_FILE)} "
                    f"is unusable: {e}; delete it to start over"
                ) from None
        return out

    def statistics(self) -> dict[str, np.ndarray]:
        """``mu``, ``sigma`` (pool) and ``mu_s``, ``sigma_s`` (spatial), by ``MomentSums``."""
        mu, sigma = self.pool_sums.mu_sigma()
        mu_s, sigma_s = self.spatial_sums.mu_sigma()
        return {"mu": mu, "sigma": sigma, "mu_s": mu_s, "sigma_s": sigma_s}


__all__ = ["DIM", "PROGRESS_FILE", "REPORT_FILE", "STATS_FILE", "AdmTally", "adm_detector", "chunk_file"]
