"""Train-step speed of dew's ``SiT-S/2`` against willisma/SiT's own on PyTorch, side by side.

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/dit.py --sit=/path/to/SiT \
        --torch_python=/work/venvs/dit/bin/python

``--sit`` is a willisma/SiT checkout (third_party/dit/README.md); the reference runs in a worker
process of ``--torch_python`` (PyTorch, timm, torchdiffeq) kept alive for the whole run. One step
on either side is SiT's ``train.py`` step at its defaults (``--path-type=Linear
--prediction=velocity``): t ~ U(0, 1), x_t = t·x₁ + (1 − t)·x₀ with x₀ ~ N(0, I), the loss
mean‖v_θ(x_t, t, y) − (x₁ − x₀)‖² with class dropout 0.1, backward, AdamW (lr 1e-4, weight decay 0)
and the EMA update (0.9999). The reference's side is its own ``transport.training_losses`` and
``update_ema``; dew's side is ``dew.models["SiT-S/2"]`` in a plain jitted step with optax's AdamW
(the same arithmetic; dew's SiT objective is a separate module). Both use float32 latents of
``--latent`` × ``--latent`` × 4 (32: ImageNet 256×256 through the SD-VAE), 1,000 classes, the same
``--batch`` and the same cores (``--threads``: ``torch.set_num_threads``; XLA's CPU thread pool
is the machine's cores, one device). Rounds alternate dew, reference, dew, ... after a warm-up; in
each round a side first runs ``--settle`` untimed steps, then times ``--steps`` steps; the report
is the medians and their ratio (the method of benchmarks/unet.py).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def batch_arrays(latent: int, batch: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, latent, latent, 4)).astype(np.float32)
    y = rng.integers(0, 1000, batch).astype(np.int32)
    return x, y


# --- the reference's side (runs in the torch venv) -----------------------------------------------
def torch_worker(args) -> int:
    from collections import OrderedDict
    from copy import deepcopy

    import torch

    sys.path.insert(0, args.sit)
    from models import SiT_models
    from transport import create_transport

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = SiT_models["SiT-S/2"](input_size=args.latent, num_classes=1000).train()
    ema = deepcopy(model).eval().requires_grad_(False)
    transport = create_transport("Linear", "velocity", None, None, None)  # train.py's defaults
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    images, labels = batch_arrays(args.latent, args.batch)
    x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    y = torch.from_numpy(labels).long()

    @torch.no_grad()
    def update_ema(decay=0.9999):  # train.py's update_ema
        ema_params = OrderedDict(ema.named_parameters())
        for name, param in model.named_parameters():
            ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)

    def step():  # train.py, one iteration
        loss = transport.training_losses(model, x, dict(y=y))["loss"].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        update_ema()

    step()
    print(
        json.dumps({"ready": True, "threads": torch.get_num_threads(), "torch": torch.__version__}),
        flush=True,
    )
    for line in sys.stdin:
        n = int(line)
        start = time.perf_counter()
        for _ in range(n):
            step()
        print(json.dumps({"seconds": (time.perf_counter() - start) / n}), flush=True)
    return 0


# --- dew's side ------------------------------------------------------------------------------------
def dew_setup(latent: int, batch: int):
    """(jitted step, state, batch): SiT's training step around ``dew.models["SiT-S/2"]``."""
    import haiku as hk
    import jax
    import jax.numpy as jnp
    import optax

    from dew import registry

    def velocity(x, t, y, is_training):
        return registry.models["SiT-S/2"](num_classes=1000)(x, t, y, is_training=is_training)

    net = hk.transform(velocity)
    optimizer = optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)
    images, labels = batch_arrays(latent, batch)
    data = (jnp.asarray(images), jnp.asarray(labels))

    def loss_fn(params, rng, x1, y):
        k_t, k_noise, k_drop = jax.random.split(rng, 3)
        t = jax.random.uniform(k_t, (x1.shape[0],))
        x0 = jax.random.normal(k_noise, x1.shape)
        xt = t[:, None, None, None] * x1 + (1 - t[:, None, None, None]) * x0
        v = net.apply(params, k_drop, xt, t, y, True)
        return jnp.mean(jnp.square(v - (x1 - x0)))

    @jax.jit
    def step(state, x1, y):
        params, opt_state, ema, rng = state
        rng, key = jax.random.split(rng)
        loss, grads = jax.value_and_grad(loss_fn)(params, key, x1, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        ema = jax.tree.map(lambda e, p: 0.9999 * e + (1 - 0.9999) * p, ema, params)
        return (params, opt_state, ema, rng), loss

    params = jax.jit(net.init, static_argnums=4)(
        jax.random.PRNGKey(0), *data[:1], jnp.zeros(batch), data[1], True
    )
    state = (params, optimizer.init(params), params, jax.random.PRNGKey(1))
    return step, state, data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latent", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="steps timed per round")
    parser.add_argument("--settle", type=int, default=1, help="untimed steps at the start of each turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sit", default="", help="willisma/SiT checkout (empty: dew only)")
    parser.add_argument("--torch_python", default="/work/venvs/dit/bin/python")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return torch_worker(args)

    import jax

    worker = None
    if args.sit:
        worker = subprocess.Popen(
            [args.torch_python, __file__, "--worker", f"--latent={args.latent}", f"--batch={args.batch}",
             f"--threads={args.threads}", f"--sit={args.sit}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        print(f"reference worker: {worker.stdout.readline().strip()}", flush=True)

    t0 = time.perf_counter()
    step, state, (x, y) = dew_setup(args.latent, args.batch)
    state, loss = step(state, x, y)
    jax.block_until_ready(loss)
    print(
        f"dew: init + compile + first step {time.perf_counter() - t0:.1f} s on {jax.devices()[0]}", flush=True
    )

    def time_dew(n: int) -> float:
        nonlocal state
        for _ in range(args.settle):
            state, out = step(state, x, y)
        jax.block_until_ready(out)
        start = time.perf_counter()
        for _ in range(n):
            state, out = step(state, x, y)
        jax.block_until_ready(out)
        return (time.perf_counter() - start) / n

    def time_reference(n: int) -> float:
        if args.settle:
            worker.stdin.write(f"{args.settle}\n")
            worker.stdin.flush()
            worker.stdout.readline()
        worker.stdin.write(f"{n}\n")
        worker.stdin.flush()
        return json.loads(worker.stdout.readline())["seconds"]

    results: dict[str, list[float]] = {"dew": [], "reference": []}
    try:
        for r in range(args.rounds):
            order = ("dew", "reference") if r % 2 == 0 else ("reference", "dew")
            for side in order:
                if side == "dew":
                    results["dew"].append(time_dew(args.steps))
                elif worker is not None:
                    results["reference"].append(time_reference(args.steps))
            print(
                f"round {r}: " + ", ".join(f"{s} {v[-1] * 1e3:.0f} ms" for s, v in results.items() if v),
                flush=True,
            )
    finally:
        if worker is not None:
            worker.stdin.close()
            worker.wait(timeout=60)
    med = {s: statistics.median(v) for s, v in results.items() if v}
    line = f"step: dew median {med['dew'] * 1e3:.1f} ms"
    if "reference" in med:
        ratio = med["reference"] / med["dew"]
        line += f", reference median {med['reference'] * 1e3:.1f} ms, reference/dew = {ratio:.2f}x"
    print(line)
    print(
        json.dumps({"latent": args.latent, "batch": args.batch, "threads": args.threads, "results": results})
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
