"""Host data pipeline throughput, images per second per core, for NVlabs/edm-format data sets
(``image_folder``): CIFAR-10-shaped 32x32x3 batches of 512 and 64x64x3 batches of 256 (EDM's
CIFAR-10 and FFHQ/AFHQv2 batch sizes), cached in memory and uncached (decoded per batch).

    PYTHONPATH=. python benchmarks/data_pipeline.py [--rounds 5] [--images 4096] [--batches 20]

The data: ``--images`` seeded-noise PNGs per resolution in a zip, written as NVlabs/edm's
``dataset_tool.py`` writes them (uncompressed PNG, ``compress_level=0``, ``00000/imgNNNNNNNN.png``)
with class labels in ``dataset.json``; opened with ``use_labels=True, xflip=True`` (half the
rows of a batch are mirrored, as with ``--xflip``). What is timed: ``Dataset.__next__`` with
``prefetch=0`` (everything on the calling thread, one core): the row gather, the mirror of the
flipped rows, the uint8 -> float32 [-1, 1] conversion, the label gather, and for the uncached
source the zip reads and PNG decodes. Reported per variant: the median over rounds of images per
second of wall time and of the thread's CPU time (``time.thread_time``: the per-core rate,
less sensitive to other processes on a shared machine), variants interleaved within each round.
Also timed: the one-off cache fill when the source opens (``decode_all``, 1 thread).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dew.data import Dataset
from dew.data.sources import image_folder as image_folder_module
from dew.data.sources.image_folder import ImageFiles, image_folder
from dew.data.sources.image_rows import decode_all

SHAPES = {32: 512, 64: 256}  # resolution -> batch


def write_zip(path: str, resolution: int, count: int) -> None:
    import PIL.Image

    rng = np.random.default_rng(resolution)
    labels = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for i in range(count):
            name = f"{i // 1000:05d}/img{i:08d}.png"
            bits = io.BytesIO()
            pixels = rng.integers(0, 256, (resolution, resolution, 3), dtype=np.uint8)
            PIL.Image.fromarray(pixels, "RGB").save(bits, format="png", compress_level=0, optimize=False)
            archive.writestr(name, bits.getbuffer())
            labels.append([name, int(i % 10)])
        archive.writestr("dataset.json", json.dumps({"labels": labels}))


def time_batches(data: Dataset, batches: int) -> tuple[float, float, int]:
    """(wall seconds, thread CPU seconds, images) for ``batches`` consecutive batches."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(batches):
        batch = next(data)
    assert batch["image"].dtype == np.float32
    return time.perf_counter() - wall, time.thread_time() - cpu, batches * data.batch_size


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--batches", type=int, default=20, help="batches timed per variant per round")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical cores visible); numpy {np.__version__}")
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as root:
        datasets = {}
        for resolution, batch in SHAPES.items():
            path = os.path.join(root, f"noise{resolution}.zip")
            write_zip(path, resolution, args.images)
            files = ImageFiles(path)
            shape = files.decode(files.images[0]).shape
            start, cpu = time.perf_counter(), time.thread_time()
            decode_all(len(files.images), lambda i, f=files: f.decode(f.images[i]), shape, workers=1)
            fill = (time.perf_counter() - start, time.thread_time() - cpu)
            print(
                f"{resolution}x{resolution}: cache fill (1 thread) {args.images / fill[0]:,.0f} "
                f"images/s wall, {args.images / fill[1]:,.0f} images/s CPU"
            )
            for cache in (True, False):
                image_folder_module._TABLES.clear()
                source = image_folder("train", path=path, use_labels=True, xflip=True, cache=cache)
                name = f"{resolution}x{resolution}x3 batch {batch}, {'cached' if cache else 'uncached'}"
                datasets[name] = Dataset(source, batch, seed=0, prefetch=0)
                next(datasets[name])  # warm up
        for r in range(args.rounds):
            names = list(datasets)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                wall, cpu, images = time_batches(datasets[name], args.batches)
                slot = results.setdefault(name, {"wall": [], "cpu": []})
                slot["wall"].append(images / wall)
                slot["cpu"].append(images / cpu)
    print(f"\n{args.rounds} rounds x {args.batches} batches per variant; medians (images/s):")
    print("| variant | per core (CPU time) | wall | rounds, CPU time |")
    print("|---|---|---|---|")
    for name, slot in results.items():
        rounds = ", ".join(f"{v:,.0f}" for v in slot["cpu"])
        cpu, wall = statistics.median(slot["cpu"]), statistics.median(slot["wall"])
        print(f"| {name} | {cpu:,.0f} | {wall:,.0f} | {rounds} |")


if __name__ == "__main__":
    main()
