"""Sampler speed: NFE per second of dew's jitted Heun against k-diffusion's ``sample_heun``
(PyTorch, CPU) on the same exact Gaussian-mixture denoiser, batch and σ schedule.

    PYTHONPATH=. .venv/bin/python benchmarks/sampling.py \
        --torch_python=/tmp/torchvenv/bin/python --k_diffusion=/tmp/kdiff/kd --threads=2

(set up the torch venv and the unpacked k-diffusion wheel as third_party/k_diffusion/README.md
says). k-diffusion runs in a worker process of that venv, kept alive for the whole run; the two
are timed alternately (dew, k-diffusion, dew, ...) for ``--rounds`` rounds, each round the
median of ``--repeats`` calls, and the ratio of the medians is reported. Both run in float32.

Both sides get the same threads: ``--threads=N`` pins this process (before JAX starts, so XLA's
CPU thread pool is sized to it) and the worker (which inherits the pinning) to the same N CPUs,
and sets PyTorch's intra-op threads to N. The report states the CPUs and both thread counts.
dew's compile time (``jit(...).lower(...).compile()``) is reported separately; the first call
of each side is warm-up, not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent(
    """
    import json, statistics, sys, time
    import numpy as np
    import torch
    sys.path.insert(0, {third_party!r})
    from make_reference import load_sampling
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads({threads})
    torch.set_num_interop_threads(1)
    kd = load_sampling(__import__("pathlib").Path({k_diffusion!r}))
    spec = json.loads(sys.stdin.readline())
    t = lambda a: torch.tensor(np.asarray(a, np.float32))
    means, var, log_w = t(spec["means"]), t(spec["stds"]) ** 2, torch.log(t(spec["weights"]))
    mean_sq = (means**2).sum(-1)[None]

    def denoise(x, sigma):  # the same algebra as dew.data.sources.mixture.GaussianMixture.denoise
        s2 = (sigma**2)[:, None]
        total = var[None] + s2
        sq = (x**2).sum(-1, keepdim=True) - 2 * x @ means.T + mean_sq
        w = torch.softmax(log_w - 0.5 * means.shape[1] * torch.log(total) - 0.5 * sq / total, -1) / total
        return x * (w * var[None]).sum(-1, keepdim=True) + s2 * (w @ means)

    sigmas = kd.get_sigmas_karras(spec["points"], 0.002, 80.0, 7.0)
    noise = torch.randn(spec["batch"], 2, generator=torch.Generator().manual_seed(0))
    run = lambda: kd.sample_heun(denoise, noise * sigmas[0], sigmas)
    with torch.no_grad():
        run()
        print("ready", torch.get_num_threads(), flush=True)
        for line in sys.stdin:
            times = []
            for _ in range(int(line)):
                start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
            print(statistics.median(times), flush=True)
    """
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch_python", default="/tmp/torchvenv/bin/python")
    parser.add_argument("--k_diffusion", default="/tmp/kdiff/kd")
    parser.add_argument(
        "--threads",
        type=int,
        default=min(2, len(os.sched_getaffinity(0))),
        help="CPUs both sides are pinned to (the same ones), and PyTorch's intra-op threads",
    )
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--points", type=int, default=18)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    available = sorted(os.sched_getaffinity(0))
    if not 1 <= args.threads <= len(available):
        print(f"error: --threads={args.threads}: this process may use {len(available)} CPUs", file=sys.stderr)
        return 2
    cpus = available[: args.threads]
    os.sched_setaffinity(0, cpus)  # before JAX starts; the worker inherits it

    import jax

    from dew.data.sources.mixture import RING
    from dew.diffusion import EDM
    from dew.sampling import nfe, sample

    worker = subprocess.Popen(
        [
            args.torch_python,
            "-c",
            WORKER.format(
                third_party=str(ROOT / "third_party" / "k_diffusion"),
                k_diffusion=args.k_diffusion,
                threads=args.threads,
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    spec = {
        "means": RING.means,
        "stds": RING.stds,
        "weights": RING.weights,
        "batch": args.batch,
        "points": args.points,
    }
    worker.stdin.write(json.dumps(spec) + "\n")
    worker.stdin.flush()
    ready = worker.stdout.readline().split()
    if not ready or ready[0] != "ready":
        print("error: the k-diffusion worker did not start (see its stderr above)", file=sys.stderr)
        return 2

    sigmas = EDM.sigmas(args.points)
    noise = jax.random.normal(jax.random.PRNGKey(0), (args.batch, 2))
    start = time.perf_counter()
    heun = jax.jit(lambda n: sample(RING.denoise, n, sigmas, "heun")).lower(noise).compile()
    compile_s = time.perf_counter() - start
    heun(noise).block_until_ready()

    def time_dew() -> float:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            heun(noise).block_until_ready()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def time_k_diffusion() -> float:
        worker.stdin.write(f"{args.repeats}\n")
        worker.stdin.flush()
        return float(worker.stdout.readline())

    dew_s, kd_s = [], []
    try:
        for _ in range(args.rounds):  # ABAB...
            dew_s.append(time_dew())
            kd_s.append(time_k_diffusion())
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
    evaluations = nfe("heun", args.points)
    dew_rate = evaluations / statistics.median(dew_s)
    kd_rate = evaluations / statistics.median(kd_s)
    print(
        f"Heun, {args.points} points = {evaluations} NFE, batch {args.batch} x 2, exact 8-component mixture"
    )
    print(f"both pinned to CPUs {cpus}; XLA CPU devices: {jax.device_count()}; torch threads: {ready[1]}")
    print(f"dew compile (trace + lower + compile, first run of this program): {compile_s:.2f} s")
    print(
        f"dew (jax {jax.__version__}, jit): median {statistics.median(dew_s) * 1e3:.2f} ms/sample -> "
        f"{dew_rate:,.0f} NFE/s"
    )
    print(
        f"k-diffusion sample_heun (torch, {ready[1]} threads): median {statistics.median(kd_s) * 1e3:.2f} "
        f"ms/sample -> {kd_rate:,.0f} NFE/s"
    )
    print(
        f"ratio dew / k-diffusion: {dew_rate / kd_rate:.2f}x  (per-round ratios: "
        + ", ".join(f"{k / d:.2f}" for d, k in zip(dew_s, kd_s, strict=True))
        + ")"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
