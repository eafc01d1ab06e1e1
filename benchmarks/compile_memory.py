"""Compile time, HLO size and peak memory of dew's EDM train step, per ``remat`` and ``scan_blocks`` option.

    PYTHONPATH=. python benchmarks/compile_memory.py --net=16 --remat=none,blocks,blocks_save_dots
    PYTHONPATH=. python benchmarks/compile_memory.py --net=16 --remat=none,blocks --scan=off,on
    PYTHONPATH=. python benchmarks/compile_memory.py --net=cifar10 --remat=none,blocks

``--scan``: ``model.scan_blocks`` off, on, or both (``off,on``); every (scan, remat) pair is one
measurement.

Each option is measured in its own fresh process with the persistent compilation cache off, so
every figure is a cold compile: ``jax.jit(step).lower(abstract state, abstract batch)`` (the
state from ``jax.eval_shape`` of init: nothing is run), then ``.compile()``; the peak memory is
``compiled.memory_analysis()`` (arguments + outputs + temporaries − aliased, the bytes XLA plans
for one step), the HLO size the optimised module's instruction count.

``--net=16``: benchmarks/unet.py's 16×16×1 network (ch 32, mult (1, 2, 2), 2 blocks, attention at
8, 10 classes), batch 64. ``--net=cifar10``: CIFAR-10's DDPM++ as NVlabs/edm trains it
(``--arch=ddpmpp``: model_channels 128, channel_mult (2, 2, 2), 4 blocks, attention at 16,
dropout 0.13, augment_dim 9, unconditional), 32×32×3, batch 64: compile only.
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

NETS = {
    "16": dict(
        res=16,
        channels=1,
        label_dim=10,
        batch=64,
        model=dict(
            model_channels=32, channel_mult=(1, 2, 2), num_blocks=2, attn_resolutions=(8,), dropout=0.10
        ),
    ),
    "cifar10": dict(
        res=32,
        channels=3,
        label_dim=0,
        batch=64,
        model=dict(
            model_channels=128,
            channel_mult=(2, 2, 2),
            num_blocks=4,
            attn_resolutions=(16,),
            dropout=0.13,
            augment_dim=9,
        ),
    ),
}

SCAN = {"off": False, "on": True}


def measure(net_name: str, remat: str, scan: bool = False) -> dict:
    """One cold compile of the train step (this process must not have compiled it before)."""
    import jax
    import jax.numpy as jnp
    import optax

    from benchmarks.edm_objective import songunet_diffusion
    from dew.averaging.ema import EMASpec
    from dew.training.steps import make_init, make_step

    jax.config.update("jax_enable_compilation_cache", False)
    net = NETS[net_name]
    res, ch, label_dim, batch = net["res"], net["channels"], net["label_dim"], net["batch"]
    objective = songunet_diffusion(res, ch, label_dim, {**net["model"], "remat": remat, "scan_blocks": scan})
    optimizer, ema = optax.adam(1e-3), EMASpec(decay=0.999)
    example = {"image": jax.ShapeDtypeStruct((batch, res, res, ch), jnp.float32)}
    if label_dim:
        example["label"] = jax.ShapeDtypeStruct((batch,), jnp.int32)
    state = jax.eval_shape(make_init(objective, optimizer, ema), jax.random.PRNGKey(0), example)
    params = sum(x.size for x in jax.tree.leaves(state.params))
    step = jax.jit(make_step(objective, optimizer, ema), donate_argnums=0)
    t0 = time.perf_counter()
    lowered = step.lower(state, example)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    memory = compiled.memory_analysis()
    hlo = compiled.as_text()
    peak = (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
    )
    return {
        "net": net_name,
        "remat": remat,
        "scan_blocks": scan,
        "parameters": int(params),
        "batch": batch,
        "lower_s": round(t1 - t0, 2),
        "compile_s": round(t2 - t1, 2),
        "temp_mib": round(memory.temp_size_in_bytes / 2**20, 1),
        "peak_mib": round(peak / 2**20, 1),
        "hlo_instructions": sum(1 for line in hlo.splitlines() if " = " in line),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETS), default="16")
    parser.add_argument("--remat", default="none,blocks,blocks_save_dots")
    parser.add_argument("--scan", default="off", help="model.scan_blocks: off, on or off,on")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    scans = args.scan.split(",")
    if any(s not in SCAN for s in scans):
        parser.error(f"--scan={args.scan!r}: expected off, on or off,on")
    if args.worker:
        print(json.dumps(measure(args.net, args.remat, SCAN[args.scan])), flush=True)
        return 0
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    for scan, remat in [(s, r) for s in scans for r in args.remat.split(",")]:
        out = subprocess.run(
            [sys.executable, __file__, "--worker", f"--net={args.net}", f"--remat={remat}", f"--scan={scan}"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode:
            print(out.stderr[-2000:], file=sys.stderr)
            return out.returncode
        print(out.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
