"""What compiling a run costs on this machine's accelerator (or CPU): its step and its init, and
the random draws of its parameters alone.

    python benchmarks/compile_cost.py --runs="DDPM++ bf16,SiT-B/2 bf16" [--batch=N] [--out=compile_cost.jsonl]

The runs are ``benchmarks/accelerator.py``'s rows (an experiment's config on arrays of its
shapes). With the persistent compilation cache off, in this one process, one JSON line each:

- ``draws``: ``jax.random.normal`` of every parameter's shape, one draw each, jitted and
  compiled (what a network's initialisers cost the compiler, nothing else);
- ``init``: the run's init program as ``Layout.jit_init`` builds it (its options, its shardings);
- ``step``: the run's step as ``Programs.step`` is jitted, lowered from abstract arguments.

Each line gives the lowering and compile seconds (wall, and the process's CPU seconds during the
compile), the lowered StableHLO's size (lines, convolutions, products) and the compiled HLO's
(lines, fusions). On a TPU v5e SiT-B/2's 131 draws took 41 s and its init 45 s, DDPM++'s step
257.5 s (``benchmarks/RESULTS.md``, fifth session).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "benchmarks")):
    if path not in sys.path:
        sys.path.append(path)


def _sizes(lowered, compiled) -> dict:
    text = lowered.as_text()
    hlo = compiled.as_text() or ""
    return {
        "stablehlo_lines": text.count("\n"),
        "convolutions": text.count("stablehlo.convolution"),
        "products": text.count("stablehlo.dot_general"),
        "hlo_lines": hlo.count("\n"),
        "fusions": hlo.count(" fusion("),
    }


def _timed(name: str, what: str, jitted, *args) -> dict:
    began = time.perf_counter()
    lowered = jitted.lower(*args)
    lowered_at, cpu = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    done = time.perf_counter()
    return {
        "run": name,
        "program": what,
        "lower_s": round(lowered_at - began, 2),
        "compile_s": round(done - lowered_at, 2),
        "compile_cpu_s": round(time.process_time() - cpu, 1),
        **_sizes(lowered, compiled),
    }


def measure(name: str, batch: int | None) -> list[dict]:
    """The three programs' rows for one of ``accelerator.RUNS`` (module docstring)."""
    import accelerator
    import jax

    from dew.runtime.precompile import abstract_like
    from dew.training.trainer import Trainer

    if batch is not None:
        row = list(accelerator.RUNS[name])
        row[1] = batch
        accelerator.RUNS[name] = tuple(row)
    config = accelerator.config_for(name)
    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer(config, workdir)
    programs = trainer.programs
    shapes = [leaf.shape for leaf in jax.tree.leaves(programs.abstract.params)]
    key = jax.random.PRNGKey(0)

    def draws(k):
        parts = jax.random.split(k, len(shapes))
        return [jax.random.normal(part, shape) for part, shape in zip(parts, shapes, strict=True)]

    batch_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), trainer.example_batch())
    state = abstract_like(programs.abstract, programs.state_shardings)
    return [
        {**_timed(name, "draws", jax.jit(draws), key), "draws": len(shapes)},
        _timed(name, "init", programs.init, key, trainer.example_batch()),  # Layout.jit_init's
        _timed(name, "step", programs.step, state, batch_shapes),
    ]


def main(argv: list[str] | None = None) -> int:
    import accelerator

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", required=True, help=f"comma-separated: {', '.join(accelerator.RUNS)}")
    parser.add_argument("--batch", type=int, help="the batch of every run (default: each row's)")
    parser.add_argument("--out", default="compile_cost.jsonl")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in accelerator.RUNS]
    if unknown:
        parser.error(f"--runs: {unknown[0]!r} is unknown; expected some of {', '.join(accelerator.RUNS)}")

    import jax

    from dew.runtime import start

    start()
    jax.config.update("jax_enable_compilation_cache", False)  # every figure a cold compile
    with open(args.out, "a") as out:
        for name in names:
            for row in measure(name, args.batch):
                row.update(device=jax.devices()[0].device_kind, jax=jax.__version__)
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
