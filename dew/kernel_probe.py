"""The measurement child of ``dew.runtime.kernel_choice``: ``python -m dew.kernel_probe MODE``,
its payload a JSON object on stdin, its answer one JSON line on stdout.

- ``shapes``: call ``payload["function"]`` ("module:function") with ``payload["args"]``; it
  returns the run's convolution shape classes, ``{"batch": B, "convolutions": [[h, w, in, out,
  k, pad, uses], ...]}`` (``trainer_convolutions`` traces a run's network from its config);
- ``time``: for each shape class, the seconds of one convolution's forward pass and both
  gradients at batch B over all of this process's CPU devices (the batch split over them as a
  run splits it), with XLA's weight gradient and with the per-tap one
  (``dew.networks.edm_layers``): ``{"times": {class: {"xla": s, "per_tap": s}}}``. The library
  is whatever this process's ``XLA_FLAGS`` chose; the parent starts one child per library.

An entry-layer module: it builds what a run builds (the Trainer, the EDM layers) in a process
of its own, so that the runtime below can measure before its own process starts JAX.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

#: Each candidate is called until this many seconds have passed (at least ``MIN_CALLS`` times,
#: after one untimed call); the fastest call counts.
MIN_SECONDS = 0.3
MIN_CALLS = 3
MAX_CALLS = 15
#: A candidate whose fastest call is this many times the other's is not called again.
CLEAR = 2.0


def trainer_convolutions(config: Mapping[str, Any], workdir: str) -> dict:
    """The convolution shape classes of the run ``config`` describes, and how often each is
    used: the Trainer is built (its state's shapes are a trace of the network) while
    ``dew.kernels`` records every convolution; batch: the per-step batch of one micro-step."""
    import ml_collections

    from dew import kernels
    from dew.training.trainer import Trainer

    c = ml_collections.ConfigDict(dict(config))
    with kernels.record_convolutions() as seen:
        Trainer(c, workdir, resolved=True)
    batch = int(c.dataset.batch_size) // int(c.train.get("accumulation", 1) or 1)
    return {"batch": batch, "convolutions": [[*shape, uses] for shape, uses in sorted(seen.items())]}


def time_convolutions(batch: int, convolutions: list[list[int]]) -> dict:
    """Seconds per call of each shape class's forward + input and weight gradients, XLA's weight
    gradient against the per-tap one, alternating calls of the two."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from dew.networks import edm_layers

    devices = jax.devices()
    if batch % len(devices):
        devices = devices[:1]
    mesh = Mesh(np.array(devices), ("data",))
    split, whole = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for h, w, cin, cout, k, pad in (tuple(c[:6]) for c in convolutions):
        x = jax.device_put(rng.standard_normal((batch, h, w, cin), np.float32), split)
        kernel = jax.device_put(rng.standard_normal((k, k, cin, cout), np.float32) / k, whole)
        ho, wo = h + 2 * pad - k + 1, w + 2 * pad - k + 1
        g = jax.device_put(rng.standard_normal((batch, ho, wo, cout), np.float32), split)
        programs = {}
        for name, conv in (("xla", edm_layers._xla_conv), ("per_tap", edm_layers._conv_tap_weight_grad)):

            def both(x, kernel, g, conv=conv, pad=pad):
                y, pullback = jax.vjp(lambda a, b: conv(a, b, pad), x, kernel)
                return (y, *pullback(g))

            programs[name] = jax.jit(both, out_shardings=(split, split, whole))
            jax.block_until_ready(programs[name](x, kernel, g))  # compile, and one untimed call
        seconds: dict[str, list[float]] = {name: [] for name in programs}
        began = time.perf_counter()
        while True:
            for name, program in programs.items():
                start = time.perf_counter()
                jax.block_until_ready(program(x, kernel, g))
                seconds[name].append(time.perf_counter() - start)
            calls = len(seconds["xla"])
            fastest = sorted(min(s) for s in seconds.values())
            if fastest[-1] > CLEAR * fastest[0]:  # decided: more calls cannot reverse the order
                break
            if calls >= MAX_CALLS or (calls >= MIN_CALLS and time.perf_counter() - began >= MIN_SECONDS):
                break
        # The fastest call: on a shared machine other processes only ever add time.
        out[json.dumps([h, w, cin, cout, k, pad])] = {n: min(s) for n, s in seconds.items()}
    return {"times": out}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("shapes", "time"):
        print("usage: python -m dew.kernel_probe shapes|time < payload.json", file=sys.stderr)
        return 2
    payload = json.loads(sys.stdin.read())
    if argv[0] == "shapes":
        module, _, name = payload["function"].partition(":")
        answer = getattr(importlib.import_module(module), name)(**payload["args"])
    else:
        answer = time_convolutions(int(payload["batch"]), payload["convolutions"])
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
