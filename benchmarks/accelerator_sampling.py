"""Sampling speed on an accelerator: the FID protocol's draws, images/s and network evaluations/s.

    python benchmarks/accelerator_sampling.py --out=sampling.jsonl [--runs="EDM cifar10 Heun-18,..."]

Each row builds an experiment's objective as the ``Trainer`` does (``benchmarks/accelerator.py``'s
``config_for``: in-memory arrays of the run's shapes, no VAE file), takes its freshly initialised
parameters (speed does not depend on their values) and times the FID protocol's own draw for
``--batch`` seeds (``dew.scoring.fid_protocol.draw_images`` for the EDM σ-sampler presets: the
samples and their uint8 images; the transformer presets' ``draw_samples``: the latents before
the VAE decode), jitted once, then the median of ``--rounds`` calls. A row states:

* ``images_per_s`` at the row's step count, and ``nfe_per_s`` (network evaluations of one
  image per second; a guided evaluation of a transformer preset counts twice, as the doubled
  batch it is);
* ``steps``: the transformer presets' 250 steps take minutes a batch on one chip, so their rows
  run ``--transformer_steps`` (default 10) and ``images_per_s_at_preset_steps`` scales the
  measured rate to the preset's own count (a per-step cost that is the same at every step);
* ``compile_s``, the device, jax's version.

Inception and DINOv2 feature extraction are ``benchmarks/feature_extraction.py``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "benchmarks")):
    if _path not in sys.path:
        sys.path.append(_path)

# name: (accelerator.py row, protocol preset, compute precision for the network)
RUNS = {
    "EDM cifar10 Heun-18": ("DDPM++ bf16", "cifar10", "float32"),
    "EDM cifar10 Heun-18 bf16": ("DDPM++ bf16", "cifar10", "bfloat16"),
    "SiT-XL/2 SDE cfg": ("SiT-XL/2 bf16", "sit", "float32"),
    "SiT-XL/2 SDE cfg bf16": ("SiT-XL/2 bf16", "sit", "bfloat16"),
    "DiT-XL/2 DDPM cfg bf16": ("DiT-XL/2 bf16", "dit", "bfloat16"),
}
DEFAULT_RUNS = ("EDM cifar10 Heun-18", "EDM cifar10 Heun-18 bf16", "SiT-XL/2 SDE cfg bf16")


def measure(name: str, batch: int, rounds: int, transformer_steps: int) -> dict:
    import accelerator
    import jax
    import jax.numpy as jnp

    from dew.objectives import protocol_presets
    from dew.scoring import fid_protocol
    from dew.training.trainer import Trainer

    row, preset_name, precision = RUNS[name]
    if row not in accelerator.RUNS and row == "DiT-XL/2 bf16":
        accelerator.RUNS[row] = ("dit.py:DiT-XL/2", 32, "bfloat16", "blocks", (32, 8), 1000, None)
    config = accelerator.config_for(row)
    config.precision.compute = precision
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer(config, workdir)
        objective = trainer.objective
        params = jax.device_put(trainer.fresh_state().params)
    preset = protocol_presets.all_presets()[preset_name]
    if isinstance(preset, protocol_presets.ObjectivePreset):
        preset = dataclasses.replace(preset, steps=transformer_steps)
        guided = preset.cfg_scale != 1.0
        evaluations = preset.steps * (2 if guided else 1)

        def draw(p, seeds):
            return preset.draw_samples(objective, p, seeds)
    else:
        evaluations = preset.nfe

        def draw(p, seeds):
            return fid_protocol.draw_images(objective, p, seeds, preset)

    seeds = jnp.arange(batch, dtype=jnp.int32)
    began = time.perf_counter()
    compiled = jax.jit(draw).lower(params, seeds).compile()
    compile_s = time.perf_counter() - began
    jax.block_until_ready(compiled(params, seeds))
    times = []
    for r in range(rounds):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, seeds + (r + 1) * batch))
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    out = {
        "run": name,
        "preset": preset_name,
        "precision": precision,
        "batch": batch,
        "steps": preset.steps,
        "nfe_per_image": evaluations,
        "seconds_per_batch": round(seconds, 3),
        "images_per_s": round(batch / seconds, 1),
        "nfe_per_s": round(batch * evaluations / seconds, 1),
        "compile_s": round(compile_s, 1),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
    }
    full = protocol_presets.all_presets()[preset_name]
    if full.steps != preset.steps:
        out["images_per_s_at_preset_steps"] = round(batch / seconds * preset.steps / full.steps, 2)
        out["preset_steps"] = full.steps
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="append one JSON line per run to this file")
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"comma-separated: {', '.join(RUNS)}")
    parser.add_argument("--batch", type=int, default=256, help="seeds (images) per draw")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transformer_steps", type=int, default=10)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        parser.error(f"--runs: {unknown} unknown; expected names from {list(RUNS)}")

    from dew.runtime import start

    start()
    status = 0
    for name in names:
        try:
            row = measure(name, args.batch, args.rounds, args.transformer_steps)
        except Exception as e:  # one run's failure (out of memory, say) is its row, not the end
            row = {"run": name, "error": " ".join(f"{type(e).__name__}: {e}".split())[:600]}
            status = 1
        line = json.dumps(row)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
