"""Will a run's step fit on a TPU? XLA's own answer, from a machine without one.

    pip install "libtpu==0.0.42.*"     # the TPU compiler of jax 0.10.2 (jax[tpu]'s), no chip needed
    JAX_PLATFORMS=cpu TPU_WORKER_HOSTNAMES=localhost python benchmarks/tpu_memory.py \
        --run="SiT-XL/2 bf16" [--batch=32] [--remat=blocks] [--topology=v5e:1x1]

The run is one of ``benchmarks/accelerator.py``'s rows (an experiment's config on arrays of its
shapes). The ``Trainer``'s step is built on the CPU, then compiled ahead of time for the devices
of a TPU topology (``jax.experimental.topologies``: libtpu compiles for a v5e without one) with
the step's shardings, donation, the Trainer's non-finite policy and the accelerators' forms of a
skipped update and of the gradient norm (``dew.training.steps.TRACED_FOR``). It prints XLA's
``memory_analysis()`` (arguments, outputs, temporaries, aliased; the total against the chip's
HBM), the step's FLOPs from its ``cost_analysis()`` and how long the compile took here; a step
that does not fit is XLA's own "Ran out of memory on HBM" line. On a TPU v5e these figures equal
the chip's (SiT-B/2 bf16 at batch 64: 8.33 GB and 8.92 TFLOP, both ways; SiT-XL/2 bf16 at batch
32: 13.41 GB with ``remat=blocks``, 15.81 GB with ``blocks_save_mlp``). (Before the gradient
norm's form followed ``TRACED_FOR`` it was traced in the CPU's form here, a concatenated copy of
every gradient: 2.9 GB more temporaries for XL/2 than the chip's.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "benchmarks")):
    if path not in sys.path:
        sys.path.append(path)


def main(argv: list[str] | None = None) -> int:
    import accelerator

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help=f"one of {', '.join(accelerator.RUNS)}")
    parser.add_argument("--batch", type=int, help="the batch (default: the row's)")
    parser.add_argument("--remat", help="the network's remat policy (default: the row's)")
    parser.add_argument(
        "--mu_dtype", help="optimizer.mu_dtype: Adam's first moment's dtype (default: the row's)"
    )
    parser.add_argument("--topology", default="v5e:1x1", help="a TPU topology, e.g. v5e:1x1, v5e:2x2")
    args = parser.parse_args(argv)
    if args.run not in accelerator.RUNS:
        parser.error(f"--run={args.run!r} is unknown; expected one of {', '.join(accelerator.RUNS)}")
    row = list(accelerator.RUNS[args.run])
    if args.batch is not None:
        row[1] = args.batch
    if args.remat is not None:
        row[3] = args.remat
    accelerator.RUNS[args.run] = tuple(row)

    import jax
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from dew.runtime import start
    from dew.training import steps
    from dew.training.trainer import Trainer

    start()
    steps.TRACED_FOR = "tpu"  # the forms a step takes on an accelerator
    config = accelerator.config_for(args.run)
    if args.mu_dtype is not None:
        config.optimizer.mu_dtype = args.mu_dtype
    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer(config, workdir)
        step = steps.make_step(
            trainer.objective,
            trainer.optimizer,
            trainer.averages,
            accumulation=trainer.accumulation,
            precision=trainer.precision,
            skip_nonfinite=trainer.config.train.nonfinite == "skip",  # as the Trainer builds it
        )
        state = trainer.programs.abstract
        batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), trainer.example_batch())
    chips = [int(n) for n in args.topology.split(":")[1].split("x")]
    bounds = tuple(min(n, 2) for n in chips) + (1,) * (3 - len(chips))
    topology = topologies.get_topology_desc(
        platform="tpu", topology_name=args.topology, chips_per_host_bounds=bounds
    )
    mesh = Mesh(topology.devices, ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())

    def everywhere(tree):
        return jax.tree.map(lambda _: replicated, tree)

    began = time.perf_counter()
    jitted = jax.jit(
        step,
        in_shardings=(everywhere(state), everywhere(batch)),
        out_shardings=(everywhere(state), replicated),
        donate_argnums=0,
    )
    try:
        compiled = jitted.lower(state, batch).compile()
    except Exception as e:  # XLA's own out-of-memory line: the answer, not a failure
        said = " ".join(str(e).split())[:400]
        print(f"{args.run} batch {row[1]} remat {row[3]} on {args.topology}: {said}")
        return 1
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    total = (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
    )
    print(
        f"{args.run} batch {row[1]} remat {row[3]} on {args.topology} ({topology.devices[0].device_kind}): "
        f"arguments {memory.argument_size_in_bytes / 1e9:.2f} GB, outputs "
        f"{memory.output_size_in_bytes / 1e9:.2f} GB (aliased {memory.alias_size_in_bytes / 1e9:.2f}), "
        f"temporaries {memory.temp_size_in_bytes / 1e9:.2f} GB, total {total / 1e9:.2f} GB "
        f"({total / 2**30:.2f} GiB); mu {config.optimizer.get('mu_dtype', 'float32')}; "
        f"{float(cost.get('flops', 0.0)) / 1e12:.2f} TFLOP a step; "
        f"compiled in {time.perf_counter() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
