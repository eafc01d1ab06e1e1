"""Feature extraction speed: dew's FID Inception vs DINOv2 ViT-L/14 (FD_DINOv2), images/s.

    PYTHONPATH=. python benchmarks/feature_extraction.py [--batch 64] [--rounds 3] [--size 64]

Both networks at their real size with random weights (seeded normal draws of every parameter's
real shape; speed does not depend on the values), on batches of uint8-valued RGB images of
``--size`` pixels (Inception resizes to 299, DINOv2 to 224, inside the jitted function, as they
score). Each function is compiled and run once before timing; then rounds alternate the two
networks (A B B A ...) in one process with the same threads, and the median round is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dew.scoring import dinov2, inception  # noqa: E402


def random_like(shapes: dict[str, dict[str, tuple[int, ...]]], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        m: {k: jnp.asarray(rng.standard_normal(s, dtype=np.float32) * 0.02) for k, s in leaves.items()}
        for m, leaves in shapes.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()

    images = (
        np.random.default_rng(0).integers(0, 256, (args.batch, args.size, args.size, 3)).astype(np.float32)
    )
    x = jnp.asarray(images)
    dino_shapes = {
        m: {k: tuple(v.shape) for k, v in leaves.items()}
        for m, leaves in jax.eval_shape(
            dinov2.network().init, jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
        ).items()
    }
    runs = {
        "inception": (
            jax.jit(lambda p, v: inception.features(p, v, value_range=(0.0, 255.0))),
            random_like(inception._expected_shapes(), 1),
        ),
        "dinov2_vitl14": (jax.jit(lambda p, v: dinov2.features(p, v)), random_like(dino_shapes, 2)),
    }
    counts = {
        name: sum(
            int(np.prod(s))
            for leaves in jax.tree_util.tree_map(np.shape, p).values()
            for s in leaves.values()
        )
        for name, (_, p) in runs.items()
    }
    for name, (fn, p) in runs.items():
        t = time.perf_counter()
        fn(p, x).block_until_ready()
        print(
            f"{name}: {counts[name]:,} parameters, compile + first batch {time.perf_counter() - t:.1f} s",
            flush=True,
        )
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else reversed(order):
            fn, p = runs[name]
            t = time.perf_counter()
            fn(p, x).block_until_ready()
            times[name].append(time.perf_counter() - t)
            print(f"round {r} {name}: {times[name][-1]:.2f} s", flush=True)
    print(f"load average {os.getloadavg()}")
    for name in runs:
        med = statistics.median(times[name])
        print(f"{name}: batch {args.batch} median {med:.2f} s -> {args.batch / med:.2f} images/s")


if __name__ == "__main__":
    main()
