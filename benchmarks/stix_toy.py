"""The toy of benchmarks/host_overhead.py trained by stix-ml 0.1.1's ``TrainingLoop``, windowed
by the driver. Runs only in stix-ml's own environment (Python >= 3.12), as a subprocess:

    /work/venv-stix/bin/python benchmarks/stix_toy.py --data rows.npy --window 500 --windows 16

The network is the flow-matching tutorial's: [x, t] -> Linear 128, SiLU -> Linear 128, SiLU ->
Linear 2 (3 -> 128 -> 128 -> 2), trained as a ``VelocityOneSidedGenerativeModel`` on a
``FlowMatchingOneSidedInterpolant`` with Adam(1e-4) and EMA 0.99, batch 256, no evaluation data
(dew's side runs no evaluation either). Batches come from a hand-written per-epoch shuffle of the
driver's rows (``--data``, float32 [N, 2]).

Protocol: at the end of every window (its TRAIN_METRICS report) the loop prints
``window <wall seconds> <process CPU seconds>`` and blocks until the driver writes a line; the
first window (it includes compilation) is reported as well, for the driver to drop.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from stix.core.embedder import IdentityEmbedder
from stix.core.gen_model.factory import VelocityOneSidedGenerativeModel
from stix.core.interpolant import FlowMatchingOneSidedInterpolant
from stix.core.modality import ModalityRegistry
from stix.nn import Network
from stix.training.loss_pipeline import LossPipeline
from stix.training.training_io_handler import LoggingCategory, TrainingIOHandler
from stix.training.training_loop import TrainingLoop, TrainingLoopConfig
from stix.typing import Batch, RawSourceTargetPair


class ToyMLP(Network):
    def __init__(self, dim: int, hidden: int, rngs: nnx.Rngs):
        self.trunk = nnx.Sequential(
            nnx.Linear(dim + 1, hidden, rngs=rngs), nnx.silu, nnx.Linear(hidden, hidden, rngs=rngs), nnx.silu
        )
        self.head = nnx.Linear(hidden, dim, rngs=rngs)

    def __call__(self, z_t, t, context_data=None, context_mask=None, attention_mask=None):
        x = z_t["x"]
        t_col = jnp.broadcast_to(jnp.atleast_1d(t), (*x.shape[:-1], 1))
        return {"x": self.head(self.trunk(jnp.concatenate([x, t_col], axis=-1)))}


def batches(rows: np.ndarray, batch_size: int, seed: int = 0):
    """Hand-written epochs: one permutation per epoch, batches sliced from it."""
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(len(rows))
        for i in range(len(rows) // batch_size):
            x = rows[order[i * batch_size : (i + 1) * batch_size]]
            yield Batch(raw_batch={"x": RawSourceTargetPair(target=x, source=None)}, is_discrete={"x": False})
        epoch += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    rows = np.load(args.data).astype(np.float32)
    train = batches(rows, args.batch)
    first = next(batches(rows, args.batch, seed=1))
    registry = ModalityRegistry.from_batch(first)
    registry.set("interpolant", FlowMatchingOneSidedInterpolant())
    registry.set(
        field="embedder",
        value=lambda modality: IdentityEmbedder(dm_shape=modality.shape),
        is_factory=True,
        use_deepcopy=True,
    )
    model = VelocityOneSidedGenerativeModel(
        network=ToyMLP(rows.shape[1], 128, nnx.Rngs(0)), modality_registry=registry
    )
    handler = TrainingIOHandler()
    clock = {"wall": time.perf_counter(), "cpu": time.process_time()}

    def window_end(category: LoggingCategory, to_log: dict, step: int) -> None:
        if category != LoggingCategory.TRAIN_METRICS:
            return
        wall, cpu = time.perf_counter() - clock["wall"], time.process_time() - clock["cpu"]
        print(f"window {wall:.6f} {cpu:.6f} loss {to_log['loss']:.4f}", flush=True)
        if not sys.stdin.readline():  # the driver went away
            sys.exit(0)
        clock["wall"], clock["cpu"] = time.perf_counter(), time.process_time()

    handler.attach_logger(window_end)
    loop = TrainingLoop(
        train_data=train,
        val_data=None,
        loss_pipeline=LossPipeline(),
        gen_model=model,
        optimizer_tx=optax.adam(1e-4),
        config=TrainingLoopConfig(
            num_steps=args.window * args.windows,
            eval_every_n_steps=args.window,
            ema_decay=0.99,
            run_eval_at_start=False,
        ),
        num_batches_per_eval_step=0,
        io_handler=handler,
    )
    print(f"stix {jax.__version__} devices {jax.devices()}", flush=True)
    loop.run()


if __name__ == "__main__":
    main()
