"""The accelerator check: CIFAR-10's DDPM++ exactly as NVlabs/edm trains it, dew vs
NVlabs/edm on the same GPU, in one command that needs no download (synthetic batches).

    PYTHONPATH=. python benchmarks/gpu.py --edm=/path/to/NVlabs-edm --peak_tflops=989
    PYTHONPATH=. python benchmarks/gpu.py --smoke --edm=/path/to/NVlabs-edm     # tiny, any CPU

The network is ``train.py --arch=ddpmpp --cond=1``'s: SongUNet at 32×32×3, model_channels 128,
channel_mult (2, 2, 2), 4 blocks, attention at 16, dropout 0.13, 10 classes, EDM's
preconditioning and loss (σ ~ lognormal(−1.2, 1.2)), Adam (lr 1e-3, betas (0.9, 0.999), eps 1e-8)
and the EMA update. For each per-device batch (``--batches``, default 64 and 512) it reports, as
JSON lines and a final table:

* dew, float32 and bfloat16 (``config.precision``: bf16 compute, f32 parameters, optimizer state
  and EMA): train images/s, the step's compile time, peak device memory
  (``compiled.memory_analysis()``), achieved TFLOP/s from XLA's cost analysis and its fraction of
  ``--peak_tflops`` (the chip's dense bf16 peak: 989 for an H100/H200 SXM);
* dew's 35-NFE sampling (18 Heun steps, the paper's CIFAR-10 sampler) images/s;
* NVlabs/edm's own ``training_loop.py`` step on the same GPU in float32 and with ``--fp16``
  (``use_fp16=True`` and ``--ls=1``, its mixed precision), and the ratio dew bf16 / edm fp16
  (the goal: ≥ 1.3× on an H200).

Sized for ≤ 8 minutes on one H200: ``--steps`` timed steps per case after ``--warmup``. Each side
runs in its own process (the reference in ``--torch_python``) so neither holds the other's memory.

Bringing dew to an offline GPU machine that has jax 0.11, PyTorch and NVlabs/edm's needs but not
haiku, ml_collections or dew's other packages: on a machine with the network, build wheels once,
``pip wheel --wheel-dir=wheels -e . dm-haiku optax orbax-checkpoint chex ml-collections clu
pydantic`` (add ``--no-deps`` for packages the GPU machine already has, e.g. jax), copy
``wheels/`` and this checkout over, and ``pip install --no-index --find-links=wheels dew``
there; this script needs nothing else (no data set, no weights).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# The checkout's root, for benchmarks.edm_objective (appended: an installed or PYTHONPATH dew wins).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)

NET = dict(
    img_resolution=32,
    img_channels=3,
    label_dim=10,
    model_channels=128,
    channel_mult=[2, 2, 2],
    num_blocks=4,
    attn_resolutions=[16],
    dropout=0.13,
)
SMOKE_NET = dict(
    NET, model_channels=16, channel_mult=[1, 2], num_blocks=1, img_resolution=16, attn_resolutions=[8]
)


def synthetic(net: dict, batch: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    res, ch = net["img_resolution"], net["img_channels"]
    images = rng.uniform(-1, 1, (batch, res, res, ch)).astype(np.float32)
    return images, rng.integers(0, net["label_dim"], batch).astype(np.int32)


def timed(fn, steps: int, warmup: int, sync) -> float:
    """Seconds per call of ``fn`` (``sync`` waits for its result), after ``warmup`` calls."""
    for _ in range(warmup):
        sync(fn())
    start = time.perf_counter()
    for _ in range(steps):
        out = fn()
    sync(out)
    return (time.perf_counter() - start) / steps


def peak_bytes(memory) -> int:
    """What XLA plans to hold at once: the step's temporaries, arguments and outputs."""
    return memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes


# --- dew ------------------------------------------------------------------------------------------
def dew_case(net: dict, batch: int, compute: str, steps: int, warmup: int, sample: bool) -> dict:
    import functools

    import jax
    import jax.numpy as jnp
    import optax

    from benchmarks.edm_objective import songunet_diffusion
    from dew.objectives.base import EMASpec
    from dew.training.precision import Precision
    from dew.training.sharding import Layout, MeshSpec
    from dew.training.steps import make_init, make_step

    kw = dict(net)
    res, ch = kw.pop("img_resolution"), kw.pop("img_channels")
    objective = songunet_diffusion(res, ch, kw["label_dim"], kw, compute_dtype=compute)
    optimizer = optax.adam(1e-3, b1=0.9, b2=0.999, eps=1e-8)
    ema, precision = EMASpec(decay=0.999), Precision(compute)
    layout = Layout.for_mesh(MeshSpec().mesh())
    devices = len(jax.devices())
    images, labels = synthetic(net, batch * devices)
    host = {"image": images, "label": labels}
    init_fn = make_init(objective, optimizer, ema, precision=precision)
    abstract = jax.eval_shape(init_fn, jax.random.PRNGKey(0), host)
    state = layout.jit_init(init_fn, abstract)(jax.random.PRNGKey(0), host)
    data = layout.place_batch(host)
    step = layout.jit_step(make_step(objective, optimizer, ema, precision=precision), abstract)
    start = time.perf_counter()
    compiled = step.lower(state, data).compile()
    compile_s = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    memory = compiled.memory_analysis()
    holder = {"state": state}

    def one():
        holder["state"], stats = compiled(holder["state"], data)
        return stats

    seconds = timed(one, steps, warmup, jax.block_until_ready)
    out = {
        "side": "dew",
        "precision": compute,
        "per_device_batch": batch,
        "devices": devices,
        "train_images_per_s": batch * devices / seconds,
        "step_ms": seconds * 1e3,
        "compile_s": compile_s,
        "peak_memory_gib": None
        if memory is None
        else (memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes)
        / 2**30,
        "tflops": float(cost.get("flops", 0.0)) / seconds / 1e12,
    }
    if sample:
        draw = jax.jit(functools.partial(objective.generate, steps=18, solver="heun"), static_argnames=())
        conditions = {"label": jnp.asarray(labels[:batch])}
        params = holder["state"].params
        seconds = timed(lambda: draw(params, jax.random.PRNGKey(1), conditions), 1, 1, jax.block_until_ready)
        out["sample_35nfe_images_per_s"] = batch / seconds
    return out


# --- NVlabs/edm -----------------------------------------------------------------------------------
def edm_case(net: dict, batch: int, fp16: bool, steps: int, warmup: int, edm: str) -> dict:
    import torch

    sys.path.insert(0, edm)
    from training.loss import EDMLoss
    from training.networks import EDMPrecond

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True  # train.py's --bench (its default)
    torch.manual_seed(0)
    model = EDMPrecond(model_type="SongUNet", use_fp16=fp16, **net).train().requires_grad_(True).to(device)
    ema = EDMPrecond(model_type="SongUNet", use_fp16=fp16, **net).eval().requires_grad_(False).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = EDMLoss()
    images, labels = synthetic(net, batch)
    x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy()).to(device)
    onehot = torch.nn.functional.one_hot(torch.from_numpy(labels).long(), net["label_dim"]).float().to(device)

    def one():  # training/training_loop.py: one round of one accumulation step, --ls=1
        opt.zero_grad(set_to_none=True)
        loss_fn(net=model, images=x, labels=onehot).sum().mul(1 / batch).backward()
        for p in model.parameters():
            if p.grad is not None:
                torch.nan_to_num(p.grad, nan=0, posinf=1e5, neginf=-1e5, out=p.grad)
        opt.step()
        with torch.no_grad():
            for pe, pn in zip(ema.parameters(), model.parameters(), strict=True):
                pe.copy_(pn.detach().lerp(pe, 0.999))

    def sync(_):
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = timed(lambda: one(), steps, warmup, sync)
    return {
        "side": "edm",
        "precision": "fp16" if fp16 else "float32",
        "per_device_batch": batch,
        "device": str(device),
        "train_images_per_s": batch / seconds,
        "step_ms": seconds * 1e3,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }


def run_child(argv: list[str], python: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([python, __file__, *argv], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return [{"error": f"{' '.join(argv)} exited {done.returncode}"}]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edm", default="", help="NVlabs/edm checkout (empty: dew only)")
    parser.add_argument("--torch_python", default=sys.executable, help="the Python with PyTorch")
    parser.add_argument("--batches", default="64,512", help="per-device batches")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the chip's dense bf16 peak")
    parser.add_argument("--smoke", action="store_true", help="a tiny network and batch, 2 steps (any CPU)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    net = SMOKE_NET if args.smoke else NET
    if args.smoke:
        args.batches, args.steps, args.warmup = "4", 2, 1
    if args.child:
        side, precision, batch = args.child.split(":")
        if side == "dew":
            row = dew_case(
                net, int(batch), precision, args.steps, args.warmup, sample=precision == "bfloat16"
            )
        else:
            row = edm_case(net, int(batch), precision == "fp16", args.steps, args.warmup, args.edm)
        print(json.dumps(row), flush=True)
        return 0
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--edm", args.edm]
    common += ["--smoke"] if args.smoke else []
    rows = []
    for batch in args.batches.split(","):
        for precision in ("float32", "bfloat16"):
            rows += run_child(["--child", f"dew:{precision}:{batch}", *common], sys.executable)
            print(json.dumps(rows[-1]), flush=True)
        if args.edm:
            for precision in ("float32", "fp16"):
                rows += run_child(["--child", f"edm:{precision}:{batch}", *common], args.torch_python)
                print(json.dumps(rows[-1]), flush=True)
    columns = (
        "side | precision | per-device batch | images/s | step ms | compile s | peak GiB | TFLOP/s | of peak"
    )
    print(f"\n| {columns} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['error']} |")
            continue
        peak = r.get("tflops", 0) / args.peak_tflops if args.peak_tflops and "tflops" in r else None
        cells = [
            r["side"],
            r["precision"],
            r["per_device_batch"],
            f"{r['train_images_per_s']:.1f}",
            f"{r['step_ms']:.1f}",
            f"{r['compile_s']:.1f}" if "compile_s" in r else "",
            f"{r['peak_memory_gib']:.2f}" if r.get("peak_memory_gib") else "",
            f"{r['tflops']:.1f}" if "tflops" in r else "",
            f"{peak:.0%}" if peak is not None else "",
        ]
        print("| " + " | ".join(map(str, cells)) + " |")
    for batch in args.batches.split(","):
        pick = {
            (r.get("side"), r.get("precision")): r for r in rows if str(r.get("per_device_batch")) == batch
        }
        if ("dew", "bfloat16") in pick and ("edm", "fp16") in pick:
            ratio = (
                pick[("dew", "bfloat16")]["train_images_per_s"] / pick[("edm", "fp16")]["train_images_per_s"]
            )
            print(f"batch {batch}: dew bf16 / NVlabs/edm fp16 = {ratio:.2f}x (goal >= 1.3x on an H200)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
