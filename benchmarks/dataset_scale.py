"""Per-batch cost of ``Dataset.__next__`` as the source grows: 20k, 200k and 2M rows of the 2-D
toy (float32 [N, 2], batch 256). Goal: the 2M-row cost within 1.2x of the 20k-row cost.

    PYTHONPATH=. python benchmarks/dataset_scale.py [--rounds 15] [--batches 2000]

Each round times ``--batches`` consecutive ``next()`` calls on each size, the sizes in a rotated
order (the machine is shared: interleaving spreads its noise over all sizes alike); the streams
continue across rounds, so the windows cross epoch boundaries (every 78 batches at 20k rows,
every 7,812 at 2M). Reported: the median over rounds of the mean per-batch time, the slowest
round, and the ratio of medians to 20k. ``--old`` also times the previous algorithm (a full
permutation per batch) for reference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dew.data import Dataset, Source

SIZES = (20_000, 200_000, 2_000_000)
BATCH = 256


def old_next(data: Dataset, epoch_batch: list[int]) -> dict[str, np.ndarray]:
    """The algorithm this replaced: the whole permutation recomputed for every batch."""
    epoch, b = epoch_batch
    order = np.random.default_rng([data.seed, epoch]).permutation(len(data.source))
    rows = order[b * BATCH : (b + 1) * BATCH]
    epoch_batch[1] += 1
    if epoch_batch[1] == data.batches_per_epoch:
        epoch_batch[:] = [epoch + 1, 0]
    return {k: v[rows] for k, v in data.source.fields.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--old", action="store_true", help="also time the per-batch permutation")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    datasets = {
        n: Dataset(
            Source(f"rows{n}", {"x": rng.standard_normal((n, 2), np.float32)}, sample_field="x"), BATCH
        )
        for n in SIZES
    }
    for data in datasets.values():
        next(data)  # first epoch's order
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    for r in range(args.rounds):
        for n in SIZES[r % 3 :] + SIZES[: r % 3]:
            data = datasets[n]
            t0 = time.perf_counter()
            for _ in range(args.batches):
                next(data)
            times[n].append((time.perf_counter() - t0) / args.batches * 1e6)
    base = statistics.median(times[SIZES[0]])
    print(f"Dataset.__next__, batch {BATCH}, {args.rounds} rounds x {args.batches} batches (µs per batch):")
    for n in SIZES:
        med = statistics.median(times[n])
        print(
            f"  {n:>9,} rows: median {med:6.1f}  slowest round {max(times[n]):6.1f}  "
            f"ratio to 20k {med / base:.3f}  (epoch at {datasets[n].save_position().decode()})"
        )
    if args.old:
        for n in SIZES:
            state = [0, 0]
            k = max(3, min(200, 20_000_000 // (n * 10)))
            t0 = time.perf_counter()
            for _ in range(k):
                old_next(datasets[n], state)
            print(f"  old algorithm, {n:>9,} rows: {(time.perf_counter() - t0) / k * 1e6:9.1f} µs per batch")


if __name__ == "__main__":
    main()
