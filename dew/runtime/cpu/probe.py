"""The dots measurement's child: ``python -m dew.runtime.cpu.probe``, given only shapes.

Its payload, a JSON object on stdin: ``{"dots": [[b, m, k, n, split, ...], ...], "same_as":
{class: digest}}`` (the rows ``dew.training.traced_dots.trace_dots`` traces); its answer, one
JSON line on stdout: for each matrix-product class the seconds of its forward pass and both
gradients over all of this process's CPU devices (``time_dots``). Where the dots go is whatever
this process's ``XLA_FLAGS`` chose: the parent (``dew.runtime.cpu.dots``) starts one child per
route, so a library that aborts the process takes only the child with it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

#: Each product is called until this many seconds have passed (at least ``MIN_CALLS`` times,
#: after one untimed call, at most ``MAX_CALLS``); the fastest call counts.
MIN_SECONDS = 0.3
MIN_CALLS = 3
MAX_CALLS = 15


def _compile(fn: Any, out_shardings: Any, args: tuple, label: str) -> tuple[Any, str]:
    """``fn`` jitted and compiled for ``args``, and a digest of its program. ``compiling <label>``
    goes to stderr first: what the parent names if XLA kills this process (a library's abort is
    no exception)."""
    import hashlib

    import jax

    print(f"compiling {label}", file=sys.stderr, flush=True)
    compiled = jax.jit(fn, out_shardings=out_shardings).lower(*args).compile()
    return compiled, hashlib.sha256((compiled.as_text() or "").encode()).hexdigest()[:16]


def _said(error: Exception) -> str:
    """An error as one line: its type and its message's first line."""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def _fastest(call: Any) -> float:
    """The fastest of ``call``'s calls (each waited for), called until ``MIN_SECONDS`` have
    passed and at least ``MIN_CALLS`` times, at most ``MAX_CALLS``: on a shared machine other
    processes only ever add time."""
    import jax

    seconds: list[float] = []
    began = time.perf_counter()
    while len(seconds) < MAX_CALLS and (
        len(seconds) < MIN_CALLS or time.perf_counter() - began < MIN_SECONDS
    ):
        start = time.perf_counter()
        jax.block_until_ready(call())
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def time_dots(dots: list[list[int]], same_as: dict[str, str] | None = None) -> dict:
    """Seconds per call of each matrix-product class's forward and both gradients (``[b, m, k] ·
    [b, k, n]`` with its cotangent, ``trainer_dots``' rows; the side ``split`` names divided over
    this process's CPU devices as a run divides its batch), and a digest of each compiled program.
    ``same_as``: another child's digests (``{class: digest}``); a program that compiles the same
    is listed in ``unchanged`` instead of being timed again. Answer: ``{"times": {class: s},
    "programs": {class: digest}, "unchanged": [class, ...], "failed": [[class, error], ...]}``."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    everything = jax.devices()
    rng = np.random.default_rng(0)
    times: dict[str, float] = {}
    digests: dict[str, str] = {}
    unchanged: list[str] = []
    failed: list[list[str]] = []
    for b, m, k, n, split in (tuple(int(v) for v in d[:5]) for d in dots):
        name = json.dumps([b, m, k, n, split])
        rows = (b, m)[split] if split < 2 else 0
        devices = everything if rows and rows % len(everything) == 0 else everything[:1]
        mesh = Mesh(np.array(devices), ("data",))
        parts = {0: PartitionSpec("data"), 1: PartitionSpec(None, "data")}.get(split, PartitionSpec())
        lhs_sharding = NamedSharding(mesh, parts)
        rhs_sharding = NamedSharding(mesh, PartitionSpec("data") if split == 0 else PartitionSpec())
        lhs = jax.device_put(rng.standard_normal((b, m, k), np.float32), lhs_sharding)
        rhs = jax.device_put(rng.standard_normal((b, k, n), np.float32) / np.sqrt(k), rhs_sharding)
        cotangent = jax.device_put(rng.standard_normal((b, m, n), np.float32), lhs_sharding)

        def both(a: Any, w: Any, g: Any) -> Any:
            y, pullback = jax.vjp(lambda a, w: jax.numpy.einsum("bmk,bkn->bmn", a, w), a, w)
            return (y, *pullback(g))

        try:
            shardings = (lhs_sharding, lhs_sharding, rhs_sharding)
            compiled, digests[name] = _compile(both, shardings, (lhs, rhs, cotangent), f"{name} dot")
            if same_as is not None and same_as.get(name) == digests[name]:
                unchanged.append(name)
                continue
            jax.block_until_ready(compiled(lhs, rhs, cotangent))  # one untimed call
        except Exception as e:  # a library route can refuse a program: said, not timed
            failed.append([name, _said(e)])
            continue
        times[name] = _fastest(lambda: compiled(lhs, rhs, cotangent))  # noqa: B023 (called here)
    return {"times": times, "programs": digests, "unchanged": unchanged, "failed": failed}


def main(argv: list[str]) -> int:
    if argv:
        print("usage: python -m dew.runtime.cpu.probe < payload.json", file=sys.stderr)
        return 2
    payload = json.loads(sys.stdin.read())
    print(json.dumps(time_dots(payload["dots"], payload.get("same_as"))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
