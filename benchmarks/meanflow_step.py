"""A MeanFlow training step (the JVP) against a plain diffusion step on the same network.

    python benchmarks/meanflow_step.py [--batch=64] [--steps=20] [--channels=32]

Both differentiate their loss with respect to the parameters of dew's digits U-Net
(``experiments/meanflow.py``'s network: 8x8x1, channel_mult (1, 2), 2 blocks, attention at 4x4,
10 classes): the ``diffusion`` objective with the EDM preset (one forward and its backward), and
the ``meanflow`` objective without guidance (a ``jax.jvp`` forward carrying the tangent, and the
backward of its primal) and with guidance folded in (ω = 1, κ = 0.5: two more forwards under
stop-gradient, the reference's default). Prints, per case, the median wall time of a jitted
``value_and_grad`` over ``--steps`` calls after a warm-up (the cases interleaved call by call),
and ``compiled.memory_analysis()``'s temporary and argument bytes, with the ratios to the
diffusion step.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cases(channels: int):
    from dew import registry
    from dew.diffusion import EDM
    from dew.inputs import Condition, Field, InputSpec
    from dew.objectives.diffusion import Diffusion
    from dew.objectives.meanflow import MeanFlow
    from dew.objectives.meanflow_loss import Guidance

    spec = InputSpec(
        Field("image", (8, 8, 1)), {"label": Condition("class_label", Field("label", (), "int32"), -1)}
    )
    unet = functools.partial(
        registry.models["unet"], channels=channels, channel_mult=(1, 2), num_blocks=2, attn_resolutions=(4,)
    )
    encoder = functools.partial(registry.encoders["class_label"], 10)
    return {
        "diffusion (EDM)": Diffusion(spec, EDM, unet, {"label": encoder}),
        "meanflow, no guidance": MeanFlow(
            spec, unet, encoder, 10, guidance=Guidance("none", class_dropout_prob=0.1)
        ),
        "meanflow, ω=1 κ=0.5": MeanFlow(spec, unet, encoder, 10, guidance=Guidance("cfg", 1.0, 0.5, 0.1)),
    }


def compile_case(objective, batch) -> tuple:
    """(the jitted value_and_grad compiled, its parameters, its memory analysis)."""
    import jax
    import jax.numpy as jnp

    from dew.training.objective import Step

    params = objective.init(jax.random.PRNGKey(0), batch)

    def loss(p, rng):
        return objective.loss(p, rng, batch, Step(jnp.int32(0)))[0]

    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, jax.random.PRNGKey(1)).compile()
    jax.block_until_ready(compiled(params, jax.random.PRNGKey(1)))  # warm-up
    return compiled, params, compiled.memory_analysis()


def measure(objectives: dict, batch, steps: int) -> dict:
    """Median step time per case, the cases interleaved step by step (so a change in the
    machine's load falls on all of them alike), and each compiled program's memory."""
    import jax

    built = {name: compile_case(o, batch) for name, o in objectives.items()}
    times: dict[str, list[float]] = {name: [] for name in built}
    for i in range(steps):
        for name, (compiled, params, _) in built.items():
            start = time.perf_counter()
            jax.block_until_ready(compiled(params, jax.random.PRNGKey(i)))
            times[name].append(time.perf_counter() - start)
    return {
        name: {
            "median_ms": 1e3 * statistics.median(times[name]),
            "temp_bytes": int(memory.temp_size_in_bytes),
            "argument_bytes": int(memory.argument_size_in_bytes),
        }
        for name, (_, _, memory) in built.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--channels", type=int, default=32)
    args = parser.parse_args()
    import jax
    import numpy as np

    g = np.random.default_rng(0)
    batch = {
        "image": jax.numpy.asarray(g.uniform(-1, 1, (args.batch, 8, 8, 1)), jax.numpy.float32),
        "label": jax.numpy.asarray(g.integers(0, 10, args.batch), jax.numpy.int32),
    }
    results = measure(cases(args.channels), batch, args.steps)
    base = results["diffusion (EDM)"]
    for name, r in results.items():
        r["time_ratio"] = r["median_ms"] / base["median_ms"]
        r["temp_ratio"] = r["temp_bytes"] / base["temp_bytes"]
        temp = r["temp_bytes"] / 2**20
        ratios = f"x{r['time_ratio']:.2f}, temp x{r['temp_ratio']:.2f}"
        print(f"{name:24s} {r['median_ms']:8.1f} ms  temp {temp:7.2f} MiB  ({ratios})")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
