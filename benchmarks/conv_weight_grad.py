"""The EDM layers' per-tap convolution weight gradient against XLA's own, in one process.

    PYTHONPATH=. python benchmarks/conv_weight_grad.py [--net=16] [--rounds=6] [--layers]

Builds ``benchmarks/unet.py``'s train step twice, once with every 3×3 convolution taking the
per-tap weight gradient (``dew.networks.edm_layers._conv_tap_weight_grad``; dew's ``conv`` takes
it from 32×32 up on x86 CPUs without AVX-512) and once with XLA's convolution and its own gradient,
compiles both (process CPU time), checks that the first step's statistics agree, then times alternating rounds
of 2 steps and prints medians. ``--layers`` times single 3×3 convolutions instead: forward,
input gradient, and the two weight gradients, at the shapes of the 16×16 and 32×32 networks.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from unet import dew_setup  # noqa: E402

import dew.networks.edm_layers as layers  # noqa: E402

DEW_CONV = layers.conv


def taps_conv(x, w, pad):
    """Every k×k convolution with the per-tap weight gradient, whatever the image size."""
    if w.shape[0] == 1 and w.shape[1] == 1 and pad == 0:
        return jnp.dot(x, w[0, 0])
    return layers._conv_tap_weight_grad(x, w, pad)


TAPS = taps_conv


def xla_conv(x, w, pad):
    """The EDM layers' conv before: XLA's convolution and XLA's gradient."""
    if w.shape[0] == 1 and w.shape[1] == 1 and pad == 0:
        return jnp.dot(x, w[0, 0])
    return layers._xla_conv(x, w, pad)


def median_ms(fn, *args, n: int = 20) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def input_grad(conv, x, w, g):
    return jax.vjp(lambda a: conv(a, w, 1), x)[1](g)[0]


def weight_grad(conv, x, w, g):
    return jax.vjp(lambda v: conv(x, v, 1), w)[1](g)[0]


def per_layer() -> None:
    shapes = [(64, 16, 32, 32), (64, 16, 64, 32), (64, 8, 64, 64), (64, 32, 64, 64)]
    for b, h, cin, cout in shapes:
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((b, h, h, cin)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((3, 3, cin, cout)) * 0.1, jnp.float32)
        g = jnp.asarray(rng.standard_normal((b, h, h, cout)), jnp.float32)
        n = 3 if h >= 32 else 20
        row = {
            "forward": median_ms(jax.jit(lambda x, w: layers._xla_conv(x, w, 1)), x, w, n=n),
            "input_grad": median_ms(jax.jit(functools.partial(input_grad, TAPS)), x, w, g, n=n),
            "weight_grad_xla": median_ms(jax.jit(functools.partial(weight_grad, xla_conv)), x, w, g, n=n),
            "weight_grad_taps": median_ms(jax.jit(functools.partial(weight_grad, TAPS)), x, w, g, n=n),
        }
        print(f"{h}x{h} {cin}->{cout}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items()), flush=True)


def whole_step(net: str, rounds: int) -> None:
    sides = {}
    for name, fn in (("xla", xla_conv), ("taps", TAPS)):
        layers.conv = fn
        init, step, data, _ = dew_setup(net, 64)
        state = init(jax.random.PRNGKey(0), data)
        start = time.process_time()
        compiled = step.lower(state, data).compile()
        print(f"{name}: step compile {time.process_time() - start:.1f} s CPU", flush=True)
        sides[name] = [compiled, state, data]
    layers.conv = DEW_CONV
    first = {}
    for name, side in sides.items():
        side[1], stats = side[0](side[1], side[2])
        first[name] = {k: float(v) for k, v in jax.device_get(stats).items() if np.ndim(v) == 0}
    print("first step statistics:", first, flush=True)
    times = {name: [] for name in sides}
    for r in range(rounds):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            side = sides[name]
            start = time.perf_counter()
            for _ in range(2):
                side[1], stats = side[0](side[1], side[2])
            jax.block_until_ready(stats)
            times[name].append((time.perf_counter() - start) / 2)
    for name, values in times.items():
        median, fastest = np.median(values) * 1e3, min(values) * 1e3
        print(f"{name}: step median {median:.0f} ms (min {fastest:.0f})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="16")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--layers", action="store_true")
    args = parser.parse_args()
    if args.layers:
        per_layer()
    else:
        whole_step(args.net, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
