"""ADM's evaluation suite inside the FID protocol (``dew.scoring.fid_protocol``): its tally's
layout (``dew.scoring.fid_progress.Tally``, the one implementation of a draw's
progress, chunk files and resume).

The protocol's detector for the suite (``dew.scoring.fid_detector.adm_detector``)
gives, per image, ``pool_3`` [2048] and ``mixed_6/conv[..., :7]`` flattened [2023] side by side
as one row [``DIM`` = 4071]. ``AdmTally`` accumulates, chunk by chunk in seed order:

* the float64 ``MomentSums`` of the pool features (FID) and of the spatial features (sFID);
* the chunk's float32 pool rows as ``<outdir>/adm-pool-<chunk>.npy`` (a plain ``.npy``, read
  back without pickle): precision and recall need every sample's row, and the Inception Score's
  softmax is a function of the row (``softmax(pool · Wᵀ)``), so it is computed from them at the
  end rather than stored.

Its progress file, ``<outdir>/adm-progress.npz``, is ``dew.scoring.progress_file``'s layout for
the pool sums plus ``total_s``, ``outer_s`` (the spatial sums) and ``pool_sha256`` (the SHA-256
of each chunk file's bytes, one per chunk done), all under its digest; what ``read`` refuses and
``resume`` sets aside is ``dew.scoring.fid_progress``'s. An interrupted and rerun draw reports
exactly what an uninterrupted one does.
"""

from __future__ import annotations

from dew.scoring.adm_evaluator import POOL_DIM, SPATIAL_DIM
from dew.scoring.fid_progress import Layout, Space, Tally
from dew.scoring.fid_reference import MomentSums

PROGRESS_FILE = "adm-progress.npz"
REPORT_FILE = "adm.json"  # the report (``dew.scoring.protocol_results``)
STATS_FILE = "adm-stats.npz"  # the samples' statistics in ADM's reference-batch layout
DIM = POOL_DIM + SPATIAL_DIM
ROWS_FILE = "adm-pool-{:05d}.npy"
LAYOUT = Layout(
    "ADM",
    PROGRESS_FILE,
    STATS_FILE,
    REPORT_FILE,
    (Space(POOL_DIM), Space(SPATIAL_DIM, "_s", "spatial")),
    rows=ROWS_FILE,
)


def chunk_file(index: int) -> str:
    """The name of chunk ``index``'s pool rows in the draw's ``outdir``."""
    return ROWS_FILE.format(index)


class AdmTally(Tally):
    """ADM's tally for ``Draw.run_tally`` (module docstring): pool and spatial sums in memory,
    each chunk's pool rows on disk under the digests the progress file records."""

    def __init__(self, num: int, chunk: int):
        super().__init__(LAYOUT, num, chunk)

    @property
    def pool_sums(self) -> MomentSums:
        return self.space_sums[0]

    @property
    def spatial_sums(self) -> MomentSums:
        return self.space_sums[1]


__all__ = ["DIM", "PROGRESS_FILE", "REPORT_FILE", "STATS_FILE", "AdmTally", "chunk_file"]
