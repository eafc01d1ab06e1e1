"""Training speed on an accelerator, against its limit: the papers' networks as ``Trainer`` runs
them, one command sized for ≤ 8 minutes on one TPU v5e chip.

    python benchmarks/accelerator.py --out=accelerator.jsonl [--peak_tflops=197] [--runs=SiT-B/2,...]

Each run is an experiment file's config as a user gets it (``experiments/sit.py:SiT-XL/2`` ...)
on an in-memory source of the same shapes (``bench_arrays``: raw latents [32, 32, 8] with 1,000
classes for the latent transformers, [32, 32, 3] pixels with 10 classes for CIFAR-10's DDPM++,
[64, 64, 8] latents for EDM2's img512), no evaluation, preview or checkpoint, at the batch,
precision and remat policy of its row (``RUNS``). For each it reports, as one JSON line:

* ``step_ms`` and ``images_per_s``: the median of ``--rounds`` windows of ``--steps`` steps of
  the compiled step (the ``Trainer``'s own program, state donated, the batch on the device);
* ``tflops``: XLA's cost analysis of that compiled step (``compiled.cost_analysis()``) over the
  step time; ``mfu``: the model's FLOPs per second (the compiled step's, less what a
  rematerialised run computes again: ``_model_flops``) as a fraction of ``--peak_tflops`` (197:
  the v5e's dense bf16 peak), ``hfu`` the compiled program's (recomputation included);
* ``attention``: the kernel the run traced with (``dew.kernels.attention``: XLA's by default;
  the ``flash-attention`` row forces the TPU's Pallas flash kernel);
* ``memory_gb``: ``compiled.memory_analysis()`` (arguments + outputs + temporaries − aliased);
* ``first_step_s``: from the backend's start to the first step's result, in this process, the
  way ``Trainer.train`` starts (the step compiling in a thread while the fresh state is built);
  ``first_step_parts_s``: the backend's start, building the ``Trainer``, the fresh state (the
  step compiling meanwhile), the step's compile left after it, the first step
  (``--warm``: every row in its own child process, ``cache: cold`` on a fresh machine's empty
  compilation cache, then the first row once more, ``cache: warm``, with the cache it filled).

A run that does not fit says so (``error``) and the next one runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)

# name: (experiment, batch, precision, remat, source shape (side, channels), classes, attention)
RUNS = {
    "SiT-B/2 f32": ("sit.py:SiT-B/2", 64, "float32", "none", (32, 8), 1000, None),
    "SiT-B/2 bf16 flash-attention": ("sit.py:SiT-B/2", 64, "bfloat16", "none", (32, 8), 1000, "tpu_flash"),
    "SiT-B/2 bf16": ("sit.py:SiT-B/2", 64, "bfloat16", "none", (32, 8), 1000, None),
    "SiT-B/2 bf16 b256": ("sit.py:SiT-B/2", 256, "bfloat16", "none", (32, 8), 1000, None),
    "SiT-B/2 bf16 float32 logits": (
        "sit.py:SiT-B/2",
        64,
        "bfloat16",
        "none",
        (32, 8),
        1000,
        "xla_float32_logits",
    ),
    "SiT-XL/2 bf16 scanned": ("sit.py:SiT-XL/2", 32, "bfloat16", "blocks", (32, 8), 1000, None),
    "SiT-B/2 bf16 save-dots scanned": (
        "sit.py:SiT-B/2",
        64,
        "bfloat16",
        "blocks_save_dots",
        (32, 8),
        1000,
        None,
    ),
    "SiT-B/2 bf16 save-dots": ("sit.py:SiT-B/2", 64, "bfloat16", "blocks_save_dots", (32, 8), 1000, None),
    "DiT-B/2 bf16": ("dit.py:DiT-B/2", 64, "bfloat16", "none", (32, 8), 1000, None),
    "SiT-L/2 bf16": ("sit.py:SiT-L/2", 32, "bfloat16", "none", (32, 8), 1000, None),
    "SiT-XL/2 bf16": ("sit.py:SiT-XL/2", 32, "bfloat16", "blocks", (32, 8), 1000, None),
    # no remat at batch 32: XLA's TPU compiler plans 15.69 GB by recomputing on its own (25.57
    # TFLOP a step against the model's 22.85), so its model FLOPs are its own lowered program's
    "SiT-XL/2 bf16 no-remat": ("sit.py:SiT-XL/2", 32, "bfloat16", "none", (32, 8), 1000, None),
    "SiT-XL/2 bf16 save-mlp": ("sit.py:SiT-XL/2", 32, "bfloat16", "blocks_save_mlp", (32, 8), 1000, None),
    "SiT-XL/2 bf16 save-mlp bf16-mu": (
        "sit.py:SiT-XL/2",
        32,
        "bfloat16",
        "blocks_save_mlp",
        (32, 8),
        1000,
        None,
    ),
    "SiT-XL/2 bf16 save-products bf16-mu": (
        "sit.py:SiT-XL/2",
        32,
        "bfloat16",
        "blocks_save_products",
        (32, 8),
        1000,
        None,
    ),
    "MF-B/2 bf16": ("meanflow.py:MF-B/2", 64, "bfloat16", "none", (32, 8), 1000, None),
    "DDPM++ bf16": ("edm_paper.py:cifar10-cond-ddpmpp", 64, "bfloat16", None, (32, 3), 10, None),
    "EDM2-S f32": ("edm2.py:img512-s", 32, "float32", None, (64, 8), 1000, None),
    "EDM2-S bf16": ("edm2.py:img512-s", 32, "bfloat16", None, (64, 8), 1000, None),
}


#: The default rows: one command within ~8 minutes on one v5e chip, where a row's first step
#: (its compile, cold) took 48-111 s.
DEFAULT_RUNS = (
    "SiT-B/2 f32",
    "SiT-B/2 bf16",
    "SiT-B/2 bf16 float32 logits",
    "DiT-B/2 bf16",
    "SiT-XL/2 bf16 save-products bf16-mu",
)


def bench_arrays(
    split: str = "train", *, side: int = 32, channels: int = 8, classes: int = 1000, rows: int = 512
):
    """Seeded arrays of a run's shapes: ``image`` [rows, side, side, channels] float32 (raw
    latents mean ‖ std when ``channels`` is 8: the std half positive; pixels in [−1, 1]
    otherwise) and ``label`` int32 in [0, classes)."""
    import numpy as np

    from dew.data.dataset import Source

    rng = np.random.default_rng(0 if split == "train" else 1)
    if channels == 8:
        mean = rng.standard_normal((rows, side, side, 4)).astype(np.float32)
        image = np.concatenate([mean, np.full_like(mean, 0.1)], axis=-1)
    else:
        image = rng.uniform(-1, 1, (rows, side, side, channels)).astype(np.float32)
    label = rng.integers(0, classes, rows).astype(np.int32)
    return Source(name=f"bench/{split}", fields={"image": image, "label": label}, num_classes=classes)


def config_for(name: str):
    from dew import registry
    from dew.config import load_config

    if "bench_arrays" not in registry.datasets.names():
        registry.datasets.register("bench_arrays", bench_arrays)
    spec, batch, precision, remat, (side, channels), classes, _ = RUNS[name]
    config = load_config(os.path.join(ROOT, "experiments", spec))
    config.dataset = {
        "name": "bench_arrays",
        "batch_size": batch,
        "side": side,
        "channels": channels,
        "classes": classes,
    }
    for section, key, value in (
        ("eval", "every", 0),
        ("preview", "every", 0),
        ("checkpoint", "every", 0),
        ("train", "log_every", 10**9),
        ("train", "steps_per_call", 1),  # the timed program is the one-step one
        ("precision", "compute", precision),
    ):
        if section not in config:
            config[section] = {}
        config[section][key] = value
    if remat is not None:
        config.model.remat = remat
    if name.endswith(" scanned"):  # the blocks as one scan (dew.networks.block_stack); its FLOPs
        # are counted once by cost_analysis (the loop body), so its MFU is the unrolled row's
        # model FLOPs over its step time
        config.model.scan_blocks = True
    if name.endswith(" bf16-mu"):  # Adam's first moment in bfloat16 (optimizer.mu_dtype)
        config.optimizer.mu_dtype = "bfloat16"
    objective = config.objective
    if "latent" in objective and objective.latent.get("encoder") is not None:
        objective.latent.weights = "/nonexistent/vae.safetensors"  # trains without the VAE file
    return config


def measure(name: str, steps: int, rounds: int, peak_tflops: float, trace: str | None = None) -> dict:
    """One run's row (module docstring), traced with the run's attention kernel when it names one."""
    from dew import kernels

    attention = RUNS[name][6]
    choice = kernels.current()
    if attention is not None:
        choice = dataclasses.replace(choice, attention=attention)
    with kernels.using(choice):
        return _measure(name, steps, rounds, peak_tflops, trace)


def _model_flops(name: str, flops: float) -> float:
    """The step's model FLOPs (what MFU counts): for a run without rematerialisation the compiled
    step's ``flops``; for a rematerialised run, the cost analysis of its twin built with
    ``remat='none'``, lowered (a trace, no compile): the same step without the recomputed
    forward. (Lowered, before XLA's optimisation, SiT-B/2 bf16's step counts 8.87 TFLOP against
    8.92 compiled: the twin's figure is the lower by 0.6 %. The run's own lowered program is no
    measure of its recomputation: it still holds the forward products that XLA's dead-code
    elimination later drops.) A `` no-remat`` row counts its own lowered program: XLA may
    rematerialise on its own to fit the chip, and its compiled FLOPs then include that."""
    if RUNS[name][3] in (None, "none") and not name.endswith(" no-remat"):
        return flops
    import jax

    from dew.training.trainer import Trainer

    config = config_for(name)
    config.model.remat = "none"
    with tempfile.TemporaryDirectory() as workdir:
        twin = Trainer(config, workdir)
        batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), twin.example_batch())
        return _flops(twin.programs.step.lower(twin.programs.abstract, batch))


def _flops(stage) -> float:
    """XLA's cost analysis of a lowered or compiled program: its FLOPs. A lowered program's
    analysis is not offered through the PJRT C API (the TPU's: ``Lowered.cost_analysis()`` is
    None there), so its HLO is counted by the CPU client's analysis, as ``Lowered.cost_analysis``
    itself does on the CPU (before XLA's optimisation nothing in it is platform-specific)."""
    import jax

    cost = stage.cost_analysis()
    if cost is None and isinstance(stage, jax.stages.Lowered):
        from jax._src.lib import _jax  # the analysis Lowered.cost_analysis calls on the CPU

        module = stage._lowering.hlo().as_hlo_module()
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0))


def compiled_cost(compiled) -> tuple[float, float | None]:
    """(the compiled program's FLOPs by XLA's cost analysis, its memory in GB by
    ``memory_analysis()``: arguments + outputs + temporaries − aliased; None where XLA has none)."""
    memory = compiled.memory_analysis()
    used = None
    if memory is not None:
        used = (
            memory.argument_size_in_bytes
            + memory.output_size_in_bytes
            + memory.temp_size_in_bytes
            - memory.alias_size_in_bytes
        ) / 1e9
    return _flops(compiled), used


def _measure(name: str, steps: int, rounds: int, peak_tflops: float, trace: str | None) -> dict:
    import jax
    import numpy as np

    from dew import kernels
    from dew.training.trainer import Trainer

    began = time.perf_counter()
    config = config_for(name)
    with tempfile.TemporaryDirectory() as workdir:
        marks = [time.perf_counter()]
        jax.devices()  # the backend's start (the TPU runtime's, on the first call in a process)
        marks.append(time.perf_counter())
        trainer = Trainer(config, workdir)
        marks.append(time.perf_counter())
        # As ``Trainer.train`` starts: the step compiles in a thread while the state is built.
        compiling = trainer.compile_step_in_background()
        state = trainer.fresh_state(beside_compile=True)
        jax.block_until_ready(state)
        marks.append(time.perf_counter())
        compiling.wait()
        compiled = compiling.compiled
        marks.append(time.perf_counter())
        source = trainer.train_source
        batch = {k: np.asarray(v[: config.dataset.batch_size]) for k, v in source.fields.items()}
        placed = trainer.programs.place(batch)
        state, stats = compiled(state, placed)
        jax.block_until_ready(stats)
        marks.append(time.perf_counter())
        first = time.perf_counter() - began
        parts = ("devices", "trainer", "state", "compile_after_state", "run")
        first_parts = {k: round(b - a, 1) for k, a, b in zip(parts, marks[:-1], marks[1:], strict=True)}
        flops, used = compiled_cost(compiled)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(steps):
                state, stats = compiled(state, placed)
            jax.block_until_ready(stats)
            times.append((time.perf_counter() - start) / steps)
        step = statistics.median(times)
        loss = float(np.asarray(stats["loss"]))
        if trace:
            state = _trace(compiled, state, placed, name, trace)
    batch_size = RUNS[name][1]
    model = _model_flops(name, flops)
    return {
        "run": name,
        "batch": batch_size,
        "precision": RUNS[name][2],
        "remat": RUNS[name][3],
        "step_ms": round(step * 1e3, 2),
        "images_per_s": round(batch_size / step, 1),
        "tflop_per_step": round(flops / 1e12, 3),
        "model_tflop_per_step": round(model / 1e12, 3),
        "tflops": round(flops / step / 1e12, 1),
        "mfu": round(model / step / 1e12 / peak_tflops, 3),
        "hfu": round(flops / step / 1e12 / peak_tflops, 3),
        "attention": kernels.current().attention,
        "memory_gb": None if used is None else round(used, 2),
        "first_step_s": round(first, 1),
        "first_step_parts_s": first_parts,
        "loss": loss,
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
    }


def _trace(compiled, state, placed, name: str, folder: str):
    """Three steps under ``jax.profiler``; the trace lands as ``<folder>/<run>.xplane.pb`` (one
    file, for xprof / TensorBoard's profile plugin)."""
    import glob
    import shutil

    import jax

    with tempfile.TemporaryDirectory() as logdir:
        jax.profiler.start_trace(logdir)
        for _ in range(3):
            state, stats = compiled(state, placed)
        jax.block_until_ready(stats)
        jax.profiler.stop_trace()
        found = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        if found:
            os.makedirs(folder, exist_ok=True)
            slug = "".join(c if c.isalnum() else "_" for c in name)
            shutil.copy(found[0], os.path.join(folder, f"{slug}.xplane.pb"))
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="accelerator.jsonl")
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"comma-separated: {', '.join(RUNS)}")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak_tflops", type=float, default=197.0)
    parser.add_argument(
        "--warm",
        action="store_true",
        help="each row in a child process (one holds the chip at a time), then the first row once more "
        "in a child: its first step with the compilation cache the first filled",
    )
    parser.add_argument("--trace", help="also write a 3-step profiler trace of each run into this folder")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's single run
    parser.add_argument("--cache", help=argparse.SUPPRESS)  # the child's label for its cache
    args = parser.parse_args(argv)
    names = [args.one] if args.one else [n.strip() for n in args.runs.split(",") if n.strip()]
    for name in names:
        if name not in RUNS:
            parser.error(f"--runs: {name!r} is unknown; expected some of {', '.join(RUNS)}")
    if args.warm and not args.one:
        # A TPU is held by one process at a time: the parent never opens it.
        common = [f"--out={args.out}", f"--steps={args.steps}", f"--peak_tflops={args.peak_tflops}"]
        if args.trace:
            common.append(f"--trace={args.trace}")
        for name, cache, rounds in [(n, "cold", args.rounds) for n in names] + [(names[0], "warm", 1)]:
            cmd = [sys.executable, os.path.abspath(__file__), *common, f"--one={name}", f"--cache={cache}"]
            subprocess.run([*cmd, f"--rounds={rounds}"], check=False)
        return 0
    from dew.runtime import start

    start()  # the platform, the compilation cache (the machine's)
    with open(args.out, "a") as out:
        for name in names:
            try:
                row = measure(name, args.steps, args.rounds, args.peak_tflops, args.trace)
            except Exception as e:  # a run that does not fit or fails: said, and the next one runs
                row = {"run": name, "error": " ".join(f"{type(e).__name__}: {e}".split())[:600]}
            if args.cache:
                row["cache"] = args.cache
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
