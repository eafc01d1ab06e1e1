"""The forward pass of each 3×3 convolution in the EDM U-Net: XLA:CPU's (as dew runs it) against
PyTorch's ``conv2d`` (oneDNN), side by side in one run.

    PYTHONPATH=. python benchmarks/conv_forward.py --net=32 [--cpu_convolutions=eigen] [--rounds=5]

The shape classes and how often the network uses each come from tracing ``benchmarks/unet.py``'s
network (``dew.kernels.record_convolutions``). dew's
side is the convolution ``dew.networks.edm_layers.conv`` lowers to, jitted on the CPU devices
``python -m dew.main`` would use, the batch split over them, with the library
``--cpu_convolutions`` picks (``dew.runtime.cpu.flags``); the reference's is
``torch.nn.functional.conv2d`` at ``--threads`` threads in a worker process of ``--torch_python``
kept alive for the whole run, NCHW as NVlabs/edm calls it, in the environment ``benchmarks/unet.py``
gives it (dew's process with glibc's malloc tunables, as ``python -m dew.main`` runs; the
reference's without). Rounds alternate dew, reference, dew,
... class by class; each side settles one untimed call first. The report: per class the medians
and their ratio, and the sum over classes weighted by their uses, which is what the convolutions
cost one forward pass of the network (the rest of a forward pass is group norms, SiLUs, the 1×1
convolutions and attention).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))


def torch_worker(threads: int) -> int:
    """Reads ``batch h w cin cout k n`` lines, answers the seconds per call of n timed calls."""
    import torch

    torch.set_num_threads(threads)
    print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
    cache: dict = {}
    for line in sys.stdin:
        batch, h, w, cin, cout, k, n = map(int, line.split())
        key = (batch, h, w, cin, cout, k)
        if key not in cache:
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(batch, cin, h, w, generator=gen)
            cache[key] = (x, torch.randn(cout, cin, k, k, generator=gen))
        x, weight = cache[key]
        with torch.no_grad():
            torch.nn.functional.conv2d(x, weight, padding=k // 2)  # settle
            start = time.perf_counter()
            for _ in range(n):
                torch.nn.functional.conv2d(x, weight, padding=k // 2)
        print(json.dumps({"seconds": (time.perf_counter() - start) / n}), flush=True)
    return 0


def dew_convolutions(classes, batch: int):
    """For each shape class, a zero-argument function running dew's jitted convolution once."""
    import jax
    import numpy as np

    from dew.networks import edm_layers
    from dew.training.sharding import Layout, MeshSpec

    layout = Layout.for_mesh(MeshSpec().mesh())
    runners = []
    for h, w, cin, cout, k, pad, _ in classes:
        rng = np.random.default_rng(0)
        x = layout.place_batch({"x": rng.standard_normal((batch, h, w, cin), np.float32)})["x"]
        weight = jax.device_put(rng.standard_normal((k, k, cin, cout), np.float32), layout.replicated)
        fn = jax.jit(lambda a, b, p=pad: edm_layers.conv(a, b, p), out_shardings=layout.batch_sharding)
        jax.block_until_ready(fn(x, weight))  # compile
        runners.append(lambda fn=fn, x=x, weight=weight: jax.block_until_ready(fn(x, weight)))
    return runners


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net", default="32")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3, help="calls timed per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu_convolutions", default="auto", choices=("auto", "eigen", "ynnpack"))
    parser.add_argument("--torch_python", default="/work/venv-torch/bin/python")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return torch_worker(args.threads)

    from dew.runtime.cpu import flags as cpu_convolutions
    from dew.runtime.cpu.devices import host_device_count, present_host_devices
    from dew.runtime.cpu.memory import with_kept_heap

    # As python -m dew.main starts: malloc's tunables (a restart), then, before JAX starts, one
    # CPU device per core and the library chosen.
    with_kept_heap()
    present_host_devices(host_device_count(0, [args.batch]))
    library = cpu_convolutions.route_convolutions(args.cpu_convolutions)
    from benchmarks.unet import reference_environment, traced_convolutions

    classes = [c for c in traced_convolutions(args.net, args.batch)["convolutions"] if c[4] > 1]
    runners = dew_convolutions(classes, args.batch)
    worker = subprocess.Popen(
        [args.torch_python, __file__, "--worker", f"--threads={args.threads}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=reference_environment(False),
    )  # fmt: skip
    print(f"reference worker: {worker.stdout.readline().strip()}; dew: {library} convolutions", flush=True)

    def reference(c) -> float:
        h, w, cin, cout, k = c[:5]
        worker.stdin.write(f"{args.batch} {h} {w} {cin} {cout} {k} {args.calls}\n")
        worker.stdin.flush()
        return json.loads(worker.stdout.readline())["seconds"]

    def dew_side(run) -> float:
        run()  # settle
        start = time.perf_counter()
        for _ in range(args.calls):
            run()
        return (time.perf_counter() - start) / args.calls

    times = {i: {"dew": [], "reference": []} for i in range(len(classes))}
    for _ in range(args.rounds):
        for i, (c, run) in enumerate(zip(classes, runners, strict=True)):
            times[i]["dew"].append(dew_side(run))
            times[i]["reference"].append(reference(c))
    worker.stdin.close()
    worker.wait()

    total = {"dew": 0.0, "reference": 0.0}
    print(f"{'H×W':>6} {'in→out':>9} {'uses':>4} {'dew ms':>8} {'ref ms':>8} {'ref/dew':>7}")
    for i, c in enumerate(classes):
        med = {side: statistics.median(v) for side, v in times[i].items()}
        for side in total:
            total[side] += c[6] * med[side]
        print(
            f"{c[0]:>3}×{c[1]:<2} {c[2]:>4}→{c[3]:<4} {c[6]:>4} {med['dew'] * 1e3:8.1f} "
            f"{med['reference'] * 1e3:8.1f} {med['reference'] / med['dew']:6.2f}×"
        )
    print(
        f"one forward's 3×3 convolutions: dew {total['dew'] * 1e3:.0f} ms, reference "
        f"{total['reference'] * 1e3:.0f} ms, reference/dew = {total['reference'] / total['dew']:.2f}×"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
