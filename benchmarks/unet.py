"""Train-step speed of dew's ``songunet`` against NVlabs/edm's ``EDMPrecond(SongUNet)`` on PyTorch.

    PYTHONPATH=. /work/venv/bin/python benchmarks/unet.py --net=16 --edm=/tmp/edm_ref
    PYTHONPATH=. /work/venv/bin/python benchmarks/unet.py --net=32 --edm=/tmp/edm_ref

``--edm`` is an NVlabs/edm checkout (third_party/edm/README.md); the reference runs in a worker
process of ``--torch_python`` kept alive for the whole run. One step on either side is the
training step as each library runs it: EDM's loss (σ ~ lognormal(−1.2, 1.2), λ(σ) weighting,
σ_data 0.5) on a fixed batch with random class labels, backward, Adam (lr 1e-3), and the EMA
update; the reference also applies its ``nan_to_num`` to the gradients, dew its non-finite
guard (``dew.training.steps.make_step``). Both use the same network arguments, batch and
float32, and the same cores (``--threads``: ``torch.set_num_threads``; XLA's CPU thread pool is
the machine's cores). dew's side runs as ``python -m dew.main`` runs it on a CPU host: the state
replicated on one XLA device per core and each batch split over them (``--devices``: another
count; ``--devices=1`` is one device using the cores through its thread pool), with glibc's
glibc's malloc keeping what a step frees for the next step, set when the process starts (a
restart: ``dew.runtime.cpu.memory``; ``--no_kept_heap``: no restart, the same settings made in
the running process instead; ``--no_reuse_freed_memory``: not those either;
``--reference_kept_heap`` gives the reference's process the same tunables) and XLA:CPU's
convolution library chosen as ``config.runtime.cpu_convolutions`` chooses it
(``--cpu_convolutions``: ``auto``, ``eigen``, ``ynnpack``; ``dew.runtime.cpu.flags``). Rounds
alternate dew, reference, dew, ... after a warm-up; in each round a side first runs ``--settle``
untimed steps (the first step after the other process's turn is 10-30 % slower on either side),
then times ``--steps`` steps; the report is the medians and their ratio. The forward pass alone
(the denoiser in inference mode) is timed the same way, after the step in each round unless
``--kinds`` says otherwise (``--kinds=forward,step`` times the forward first, ``--kinds=forward``
only the forward).

dew's start-up is timed separately in a fresh process without the persistent compilation cache:
jitted ``init`` (compile + run) and the step's compile + first step (``--startup``), the latter
also in its parts: tracing, lowering, XLA's compile and the first step's run.

How far from the machine, beside how far from the reference: each median is also reported as
achieved FLOP/s, from one FLOP count for both sides (XLA's cost analysis of dew's step and
forward, lowered for one device and the whole batch: the same arithmetic the reference does), and
as a fraction of the CPU's peak: cores (``--threads``) × clock × float32 FLOP per cycle, the
last from the vector width the CPU's flags report (16 lanes with AVX-512, 8 with AVX2) × 2 for a
fused multiply-add × ``--fma_units`` (2 for Intel's server cores with two 512-bit FMA units and
for AMD Zen 2/3 at 256 bits; AMD Zen 4 runs a 512-bit operation as two 256-bit halves, so
``--fma_units=1`` gives its peak), and the clock from ``/proc/cpuinfo`` (``--cpu_ghz``: the
all-core clock, where the nominal one misleads).

``--gpu`` runs dew's side alone on an accelerator in bfloat16 and float32 and reports achieved
FLOP/s against ``--peak_tflops`` (XLA's cost analysis of the compiled step).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # for benchmarks.edm_objective (appended: an installed dew wins)
    sys.path.append(str(ROOT))

NETS = {
    # The issue's networks: 16x16x1 (ch 32) and 32x32x3 (ch 64), DDPM++ blocks, 10 classes.
    "16": dict(img_resolution=16, img_channels=1, label_dim=10, model_channels=32, channel_mult=[1, 2, 2],
               num_blocks=2, attn_resolutions=[8], dropout=0.10),
    "32": dict(img_resolution=32, img_channels=3, label_dim=10, model_channels=64, channel_mult=[1, 2, 2],
               num_blocks=2, attn_resolutions=[16], dropout=0.10),
    # The digits race network: 8x8x1, ch 32, mult [1, 2], 2 blocks, attention at 4.
    "8": dict(img_resolution=8, img_channels=1, label_dim=10, model_channels=32, channel_mult=[1, 2],
              num_blocks=2, attn_resolutions=[4], dropout=0.10),
}  # fmt: skip


def reference_environment(kept_heap: bool) -> dict:
    """The reference worker's environment: this process's without glibc's malloc tunables (which
    dew's side restarted itself with), or with them when ``kept_heap``."""
    from dew.runtime.cpu.memory import TUNABLES, kept_heap_environment

    items = os.environ.get("GLIBC_TUNABLES", "").split(":")
    kept = ":".join(i for i in items if i and i.split("=", 1)[0] not in TUNABLES)
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update({"GLIBC_TUNABLES": kept} if kept else {})
    return (kept_heap_environment(env) or env) if kept_heap else env


def batch_arrays(net: dict, batch: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    res, ch = net["img_resolution"], net["img_channels"]
    images = rng.uniform(-1, 1, (batch, res, res, ch)).astype(np.float32)
    labels = rng.integers(0, net["label_dim"], batch).astype(np.int32)
    return images, labels


# --- the reference's side (runs in the torch venv) -----------------------------------------------
def torch_worker(args) -> int:
    import torch

    sys.path.insert(0, args.edm)
    from training.loss import EDMLoss
    from training.networks import EDMPrecond

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net_kwargs = NETS[args.net]
    net = EDMPrecond(model_type="SongUNet", **net_kwargs).train()
    ema = EDMPrecond(model_type="SongUNet", **net_kwargs).eval().requires_grad_(False)
    ema.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = EDMLoss()
    images, labels = batch_arrays(net_kwargs, args.batch)
    x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    onehot = torch.nn.functional.one_hot(torch.from_numpy(labels).long(), net_kwargs["label_dim"]).float()

    def step():  # training/training_loop.py, one round, one accumulation step
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net=net, images=x, labels=onehot)
        loss.sum().mul(1 / x.shape[0]).backward()
        for p in net.parameters():
            if p.grad is not None:
                torch.nan_to_num(p.grad, nan=0, posinf=1e5, neginf=-1e5, out=p.grad)
        opt.step()
        with torch.no_grad():
            for pe, pn in zip(ema.parameters(), net.parameters(), strict=True):
                pe.copy_(pn.detach().lerp(pe, 0.999))

    sigma = torch.full([x.shape[0]], 1.0)

    def forward():
        with torch.no_grad():
            ema(x, sigma, onehot)

    step()
    forward()
    print(
        json.dumps({"ready": True, "threads": torch.get_num_threads(), "torch": torch.__version__}),
        flush=True,
    )
    for line in sys.stdin:
        kind, n = line.split()
        fn = step if kind == "step" else forward
        start = time.perf_counter()
        for _ in range(int(n)):
            fn()
        print(json.dumps({"seconds": (time.perf_counter() - start) / int(n)}), flush=True)
    return 0


# --- dew's side ------------------------------------------------------------------------------------
def dew_training(net_name: str):
    """(objective, optimizer, EMA) of dew's side: the network's EDM objective, Adam, EMA 0.999."""
    import optax

    from benchmarks.edm_objective import songunet_diffusion
    from dew.objectives.base import EMASpec

    net = dict(NETS[net_name])
    res, ch = net.pop("img_resolution"), net.pop("img_channels")
    objective = songunet_diffusion(res, ch, net["label_dim"], net)
    return objective, optax.adam(1e-3, b1=0.9, b2=0.999, eps=1e-8), EMASpec(decay=0.999)


def step_flops(net_name: str, batch: int) -> dict[str, float]:
    """FLOP of one train step and one forward pass of the whole batch: XLA's cost analysis of the
    programs lowered for one device (before any backend fusion, so the convolution library does
    not change the count). The reference computes the same network on the same batch, so one
    count serves both sides."""
    import jax
    import jax.numpy as jnp

    from dew.training.steps import make_init, make_step

    objective, optimizer, ema = dew_training(net_name)
    images, labels = batch_arrays(NETS[net_name], batch)
    host_batch = {"image": images, "label": labels}
    state = jax.eval_shape(make_init(objective, optimizer, ema), jax.random.PRNGKey(0), host_batch)

    def forward(params, x, labels):
        return objective.denoiser(params, {"label": labels})(x, jnp.ones((x.shape[0],)))

    def count(fn, *args) -> float:
        cost = jax.jit(fn).lower(*args).cost_analysis()
        cost = cost[0] if isinstance(cost, list | tuple) else cost
        return float(cost["flops"])

    return {
        "step": count(make_step(objective, optimizer, ema), state, host_batch),
        "forward": count(forward, state.params, images, labels),
    }


def cpu_peak_gflops(threads: int, fma_units: int, ghz: float = 0.0) -> dict:
    """The CPU's float32 peak on ``threads`` cores: cores × GHz × lanes × 2 (a fused multiply-add
    is two FLOP) × ``fma_units``; lanes from the vector width the CPU reports (/proc/cpuinfo),
    the clock from its ``cpu MHz`` unless ``ghz`` is given."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []

    def field(name: str) -> list[str]:
        return [line.split(":", 1)[1].strip() for line in lines if line.startswith(name)]

    flags = set(field("flags")[0].split()) if field("flags") else set()
    lanes = 16 if "avx512f" in flags else 8 if {"avx2", "fma"} <= flags else 4
    ghz = ghz or max((float(mhz) / 1e3 for mhz in field("cpu MHz")), default=0.0)
    gflops = threads * ghz * lanes * 2 * fma_units
    model = (field("model name") or [""])[0]
    return dict(model=model, cores=threads, ghz=ghz, lanes=lanes, fma_units=fma_units, gflops=gflops)


def dew_setup(net_name: str, batch: int, initialize: bool = True):
    """(jitted step, state, batch, jitted forward) for dew's songunet, via the trainer's pure stages
    (``initialize=False``: the init function itself instead of its jitted form, nothing placed)."""
    import functools

    import jax
    import jax.numpy as jnp

    from dew.training.sharding import Layout, MeshSpec
    from dew.training.steps import make_init, make_step

    objective, optimizer, ema = dew_training(net_name)
    images, labels = batch_arrays(NETS[net_name], batch)
    host_batch = {"image": images, "label": labels}
    init_fn = make_init(objective, optimizer, ema)
    if not initialize:  # no mesh: the kernel choice traces this before JAX's backend starts
        return init_fn, None, host_batch, None
    # As the Trainer compiles and places them (dew.training.sharding.Layout): the state on the
    # mesh (replicated: data parallelism), each batch split over its devices, init run once.
    layout = Layout.for_mesh(MeshSpec().mesh())
    layout.check_batch(batch)
    data = layout.place_batch(host_batch)
    abstract_state = jax.eval_shape(init_fn, jax.random.PRNGKey(0), host_batch)
    jitted_init = layout.jit_init(init_fn, abstract_state)

    def init(rng, example=host_batch):  # its batch is an example of shapes, replicated
        return jitted_init(rng, jax.device_get(example))

    step = layout.jit_step(make_step(objective, optimizer, ema), abstract_state)

    @functools.partial(jax.jit, out_shardings=layout.batch_sharding)
    def forward(params, x, labels):
        return objective.denoiser(params, {"label": labels})(x, jnp.ones((x.shape[0],)))

    return init, step, data, forward


def choose_kernels(args):
    """As ``dew.runtime.start`` chooses them for a run: the library and the weight gradients from
    ``--cpu_convolutions``/``--cpu_weight_gradient`` (``auto``: the CPU-flag rule,
    ``dew.runtime.cpu.flags``), before JAX starts; returns the decision."""
    from dew import kernels
    from dew.runtime.cpu import choice, flags

    decision = choice.choose(args.cpu_convolutions, args.cpu_weight_gradient)
    flags.route_convolutions(decision.library)
    kernels.set_choice(decision.kernel_choice())
    from dew.runtime.cpu.memory import reuse_freed_memory

    if not args.no_reuse_freed_memory:  # as dew.runtime.start does (nothing to do after the restart)
        reuse_freed_memory()
    return decision


def dew_startup(args) -> dict:
    """Seconds for jitted init (compile + run) and for the step's compile + first step, the
    latter also in its parts: tracing (Python), lowering to StableHLO, XLA's compile, and the
    first step's run."""
    import jax

    t0 = time.perf_counter()
    init, step, data, _ = dew_setup(args.net, args.batch)
    t1 = time.perf_counter()
    state = jax.block_until_ready(init(jax.random.PRNGKey(0), data))
    t2 = time.perf_counter()
    traced = step.trace(state, data)
    t_traced = time.perf_counter()
    lowered = traced.lower()
    t_lowered = time.perf_counter()
    compiled = lowered.compile()
    t_compiled = time.perf_counter()
    state, stats = compiled(state, data)
    jax.block_until_ready(stats)
    t3 = time.perf_counter()
    return {
        "build_s": t1 - t0,
        "init_s": t2 - t1,
        "compile_and_first_step_s": t3 - t2,
        "trace_s": t_traced - t2,
        "lower_s": t_lowered - t_traced,
        "xla_compile_s": t_compiled - t_lowered,
        "first_step_s": t3 - t_compiled,
    }


def run_dew_rounds(args, worker) -> dict:
    import jax

    init, step, data, forward = dew_setup(args.net, args.batch)
    state = init(jax.random.PRNGKey(0), data)
    for _ in range(2):
        state, stats = step(state, data)
    jax.block_until_ready(stats)
    jax.block_until_ready(forward(state.params, data["image"], data["label"]))

    def run_dew(kind: str, n: int):
        nonlocal state
        out = None
        for _ in range(n):
            if kind == "step":
                state, out = step(state, data)
            else:
                out = forward(state.params, data["image"], data["label"])
        return jax.block_until_ready(out)

    def time_dew(kind: str, n: int) -> float:
        run_dew(kind, args.settle)  # untimed: the first calls after the other side's turn are slower
        start = time.perf_counter()
        run_dew(kind, n)
        return (time.perf_counter() - start) / n

    def run_reference(kind: str, n: int) -> float:
        worker.stdin.write(f"{kind} {n}\n")
        worker.stdin.flush()
        return json.loads(worker.stdout.readline())["seconds"]

    def time_reference(kind: str, n: int) -> float:
        if args.settle:
            run_reference(kind, args.settle)  # untimed, as on dew's side
        return run_reference(kind, n)

    results = {kind: {"dew": [], "reference": []} for kind in args.kinds}
    for r in range(args.rounds):
        for kind in args.kinds:
            n = args.steps if kind == "step" else 2 * args.steps
            order = ("dew", "reference") if r % 2 == 0 else ("reference", "dew")
            for side in order:
                if side == "dew":
                    results[kind]["dew"].append(time_dew(kind, n))
                elif worker is not None:
                    results[kind]["reference"].append(time_reference(kind, n))
        print(
            f"round {r}: "
            + ", ".join(f"{k} {s} {v[s][-1] * 1e3:.0f} ms" for k, v in results.items() for s in v if v[s]),
            flush=True,
        )
    return results


def run_gpu(args) -> int:
    """dew alone on the default accelerator: the train step (float32) and the forward pass in
    float32 and bfloat16 (parameters and inputs cast), with FLOP/s from XLA's cost analysis."""
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    if device.platform == "cpu":
        print("error: --gpu found no accelerator (jax.devices() is CPU only)", file=sys.stderr)
        return 2
    init, step, data, forward = dew_setup(args.net, args.batch)
    state = init(jax.random.PRNGKey(0), data)

    def flops(compiled) -> float:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return float(cost.get("flops", 0.0))

    def timed(fn, *a, n=20):
        out = fn(*a)
        jax.block_until_ready(out)
        start = time.perf_counter()
        for _ in range(n):
            out = fn(*a)
        jax.block_until_ready(out)
        return (time.perf_counter() - start) / n

    report = {"device": str(device), "net": args.net, "batch": args.batch}
    step_flops = flops(step.lower(state, data).compile())
    state_copy = jax.tree.map(jnp.copy, state)

    def one_step(st):
        return step(st, data)[0]

    seconds = timed(lambda: jax.block_until_ready(one_step(jax.tree.map(jnp.copy, state_copy))))
    report["step_f32"] = {"ms": seconds * 1e3, "tflops": step_flops / seconds / 1e12}
    for dtype in (jnp.float32, jnp.bfloat16):
        params = jax.tree.map(lambda a, d=dtype: a.astype(d), state.params)
        x = data["image"].astype(dtype)
        fwd_flops = flops(forward.lower(params, x, data["label"]).compile())
        seconds = timed(forward, params, x, data["label"])
        report[f"forward_{jnp.dtype(dtype).name}"] = {
            "ms": seconds * 1e3,
            "tflops": fwd_flops / seconds / 1e12,
        }
    if args.peak_tflops:
        for value in report.values():
            if isinstance(value, dict):
                value["fraction_of_peak"] = value["tflops"] / args.peak_tflops
    print(json.dumps(report, indent=1))
    return 0


def profile(args) -> int:
    """Trace 3 warm steps (or forward calls, ``--profile_forward``; perfetto) and print XLA's thunk
    time by kind (fusion name sans number)."""
    import collections
    import glob
    import gzip
    import re

    import jax

    init, step, data, forward = dew_setup(args.net, args.batch)
    state = init(jax.random.PRNGKey(0), data)
    for _ in range(2):
        state, stats = step(state, data)
    jax.block_until_ready(stats)
    jax.block_until_ready(forward(state.params, data["image"], data["label"]))
    with jax.profiler.trace(args.profile, create_perfetto_trace=True):
        for _ in range(3):
            if args.profile_forward:
                stats = forward(state.params, data["image"], data["label"])
            else:
                state, stats = step(state, data)
        jax.block_until_ready(stats)
    path = sorted(glob.glob(f"{args.profile}/**/*perfetto_trace.json.gz", recursive=True))[-1]
    with gzip.open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(("ThunkExecutor", "$", "Pjit")):
            kind = re.sub(r"[._]\d+$", "", e["name"])
            total[kind] += e["dur"]
            calls[kind] += 1
    whole = sum(total.values())
    for kind, us in total.most_common(20):
        print(f"{100 * us / whole:5.1f} %  {calls[kind] // 3:5d} calls/step  {us / 3e3:9.1f} ms/step  {kind}")
    return 0


def measure_startup(args) -> dict:
    """dew's start-up in a fresh process without the compilation cache (``--startup``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    cmd = [sys.executable, __file__, "--startup", f"--net={args.net}", f"--batch={args.batch}"]
    cmd += [
        f"--cpu_convolutions={args.cpu_convolutions}",
        f"--cpu_weight_gradient={args.cpu_weight_gradient}",
    ]
    cmd += ["--no_kept_heap"] if args.no_kept_heap else []
    startup = json.loads(
        subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    )
    return startup


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", choices=sorted(NETS), default="16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="steps timed per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--edm", default="", help="NVlabs/edm checkout (empty: dew only)")
    parser.add_argument("--torch_python", default="/work/venv-torch/bin/python")
    parser.add_argument("--startup", action="store_true", help="time dew's init/compile in this process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip_startup", action="store_true", help="no fresh-process start-up timing")
    parser.add_argument("--gpu", action="store_true", help="dew alone on an accelerator, bf16 and f32")
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the chip's peak, for --gpu")
    parser.add_argument("--fma_units", type=int, default=2, help="FMA units per core, for the CPU's peak")
    parser.add_argument("--cpu_ghz", type=float, default=0.0, help="all-core clock (0: /proc/cpuinfo's)")
    parser.add_argument("--profile", default="", help="trace 3 dew steps into this directory, print shares")
    parser.add_argument("--profile_forward", action="store_true", help="--profile the forward pass instead")
    parser.add_argument(
        "--devices", type=int, default=0,
        help="CPU devices dew's batch is split over (0: as python -m dew.main picks, one per core)",
    )  # fmt: skip
    parser.add_argument(
        "--cpu_convolutions", default="auto", choices=("auto", "eigen", "ynnpack"),
        help="XLA:CPU's convolution library on dew's side (as config.runtime.cpu_convolutions)",
    )  # fmt: skip
    parser.add_argument(
        "--cpu_weight_gradient", default="auto", choices=("auto", "xla", "per_tap"),
        help="convolution weight gradients on dew's side (as config.runtime.cpu_weight_gradient)",
    )  # fmt: skip
    parser.add_argument(
        "--settle", type=int, default=1,
        help="untimed steps (and forward calls) each side runs at the start of its turn in a round",
    )  # fmt: skip
    parser.add_argument(
        "--no_kept_heap", action="store_true",
        help="dew's side without restarting with glibc's malloc tunables (python -m dew.main sets them)",
    )  # fmt: skip
    parser.add_argument(
        "--no_reuse_freed_memory", action="store_true",
        help="dew's side with glibc's malloc defaults (dew.main keeps freed memory for the next step)",
    )  # fmt: skip
    parser.add_argument(
        "--reference_kept_heap", action="store_true",
        help="the reference's worker with dew's malloc tunables too (default: its process as users run it)",
    )  # fmt: skip
    parser.add_argument(
        "--kinds", default="step,forward", type=lambda s: tuple(s.split(",")),
        help="what each round times, in order: step, forward or both ('forward,step': the forward first)",
    )  # fmt: skip
    args = parser.parse_args()
    if set(args.kinds) - {"step", "forward"} or len(set(args.kinds)) != len(args.kinds):
        kinds = ",".join(args.kinds)
        parser.error(f"--kinds={kinds!r}: expected step and/or forward, each at most once, comma-separated")
    if args.worker:
        return torch_worker(args)
    from dew.runtime.cpu.devices import flagged_count, host_device_count, present_host_devices
    from dew.runtime.cpu.memory import with_kept_heap

    if not args.no_kept_heap:
        with_kept_heap()  # as python -m dew.main does: restarts this process once, with the tunables
    # Before JAX starts (dew.main does the same from config.runtime.host_devices); XLA_FLAGS wins.
    present_host_devices(host_device_count(args.devices, [args.batch]))
    chose = time.perf_counter()
    decision = choose_kernels(args)
    args.kernel_choice_s = time.perf_counter() - chose
    args.convolutions = decision.library
    args.devices = flagged_count(os.environ.get("XLA_FLAGS", "")) or 1
    if not (args.worker or args.startup):
        print(f"dew: kernel choice ({args.kernel_choice_s:.1f} s): {decision.line()}", flush=True)
    if args.gpu:
        return run_gpu(args)
    if args.startup:
        print(json.dumps({"kernel_choice_s": args.kernel_choice_s, **dew_startup(args)}))
        return 0
    if args.profile:
        return profile(args)

    # Start-up in a fresh process without the compilation cache, before the rounds.
    startup = {}
    if not args.skip_startup:
        startup = measure_startup(args)
    where = f"{args.devices} CPU device(s), {args.convolutions} convolutions"
    print(f"dew on {where}; start-up: {json.dumps({k: round(v, 2) for k, v in startup.items()})}", flush=True)

    worker = None
    if args.edm:
        worker = subprocess.Popen(
            [args.torch_python, __file__, "--worker", f"--net={args.net}", f"--batch={args.batch}",
             f"--threads={args.threads}", f"--edm={args.edm}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=reference_environment(args.reference_kept_heap),
        )  # fmt: skip
        print(f"reference worker: {worker.stdout.readline().strip()}", flush=True)
    try:
        results = run_dew_rounds(args, worker)
    finally:
        if worker is not None:
            worker.stdin.close()
            worker.wait(timeout=60)
    flops = step_flops(args.net, args.batch)
    peak = cpu_peak_gflops(args.threads, args.fma_units, args.cpu_ghz)
    print(
        f"peak: {peak['model'] or 'this CPU'}, {peak['cores']} cores x {peak['ghz']:.2f} GHz x "
        f"{peak['lanes']} float32 lanes x 2 (FMA) x {peak['fma_units']} FMA units "
        f"= {peak['gflops']:.0f} GFLOP/s"
    )
    achieved = {}
    for kind, sides in results.items():
        med = {s: statistics.median(v) for s, v in sides.items() if v}
        achieved[kind] = {s: flops[kind] / m / 1e9 for s, m in med.items()}

        def rate(side: str, kind=kind) -> str:
            gflops = achieved[kind][side]
            share = f", {100 * gflops / peak['gflops']:.1f} % of peak" if peak["gflops"] else ""
            return f"{gflops:.1f} GFLOP/s{share}"

        line = f"{kind} ({flops[kind] / 1e9:.2f} GFLOP): dew median {med['dew'] * 1e3:.1f} ms ({rate('dew')})"
        if "reference" in med:
            ratio = med["reference"] / med["dew"]
            line += f", reference median {med['reference'] * 1e3:.1f} ms ({rate('reference')})"
            line += f", reference/dew = {ratio:.2f}x"
        print(line)
    record = {"net": args.net, "batch": args.batch, "devices": args.devices, "startup": startup}
    record.update(flops=flops, peak=peak, achieved_gflops=achieved)
    record["convolutions"] = args.convolutions
    record["kernel_choice"] = {"seconds": args.kernel_choice_s, **decision.record(), "how": decision.how}
    print(json.dumps({**record, "results": results}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
