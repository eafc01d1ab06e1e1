"""One process of the two-process data-parallel test (tests/system/test_multihost.py starts two).

argv: process_id, coordinator port, workdir, output .npz path. Each process has 2 CPU devices;
the mesh spans the 4 devices of both processes; each process reads its own half of every batch.
The run is the 2D mixture's with a one-block MLP: what is tested is the multi-controller
machinery (mesh, per-process data, collectives, evaluation prefix, hosted previews), which is the
same for every network, and this one compiles in a second instead of the U-Net's ~30.
"""

from __future__ import annotations

import sys
from typing import cast

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port, workdir, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

import numpy as np  # noqa: E402
from helpers_cli import TINY_MIXTURE  # noqa: E402
from helpers_common import ROOT  # noqa: E402
from jax._src import distributed  # noqa: E402  (the coordination-service client, for a barrier)
from jax.stages import Wrapped  # noqa: E402

from dew.artifacts import ImageGrid  # noqa: E402
from dew.config import apply_overrides, load_config  # noqa: E402
from dew.training.evaluation import Evaluation, evaluate  # noqa: E402
from dew.training.loop import fit  # noqa: E402
from dew.training.stage import Stage  # noqa: E402
from dew.training.trainer import Trainer  # noqa: E402

assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.device_count())
MIXTURE = {
    **TINY_MIXTURE,
    "train.num_steps": 3,
    "eval.every": 0,
    "checkpoint.keep_best": False,
    "mesh.devices": 0,
}
config = load_config(str(ROOT / "experiments" / "mixture2d.py"))
config = apply_overrides(config, [f"config.{k}={v}" for k, v in MIXTURE.items()])
trainer = Trainer(config, workdir)
assert trainer.mesh.shape == {"data": 4}, trainer.mesh.shape
assert trainer.train_data.batch_size == 8  # half of the global batch of 16
state = trainer.initial_state()
initial = jax.device_get(jax.tree.map(lambda x: x.addressable_data(0), state.params))
losses = []


class RecordLoss(Stage):
    every = 0

    def due(self, ctx):
        return False

    def observe(self, ctx):
        losses.append(float(ctx.stats["loss"]))

    def close(self):
        pass


# Compile the Trainer's sharded step first, then meet at a coordination-service barrier: gloo
# sets up its context at the first collective and gives up after 30 s, which a process still
# compiling on a loaded 2-core machine can exceed.
local = {
    k: np.zeros((trainer.train_data.batch_size, *v.shape[1:]), v.dtype)
    for k, v in trainer.train_source.fields.items()
}
# Programs types its jitted programs as plain callables; they are jax's jitted functions
compiled = cast(Wrapped, trainer.programs.step).lower(state, trainer.layout.place_batch(local)).compile()
client = distributed.global_state.client
assert client is not None  # jax.distributed.initialize above started it
client.wait_at_barrier("step_compiled", 600_000)


def step(state, batch):
    return compiled(state, trainer.layout.place_batch(batch))


state = fit(state, step, iter(trainer.train_data), 3, [RecordLoss()])
params = state.params
# Replicated: every local device holds the whole array; the first local copy is this process's.
for leaf in jax.tree.leaves(params):
    assert leaf.sharding.is_fully_replicated and not leaf.is_fully_addressable
    copies = [np.asarray(s.data) for s in leaf.addressable_shards]
    assert all(np.array_equal(copies[0], c) for c in copies[1:])
flat = {
    jax.tree_util.keystr(path): np.asarray(leaf.addressable_data(0))
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
}
moved = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(
        jax.tree.leaves(initial),
        jax.tree.leaves(jax.device_get(jax.tree.map(lambda x: x.addressable_data(0), params))),
        strict=True,
    )
)
# evaluate: process 0 offers 3 validation batches, process 1 only 2; both must run the same 2.
# Compile the eval program first and meet again, for the same reason as the step.
val = trainer.val_data.first(3)
rng = jax.random.PRNGKey(0)
cast(Wrapped, trainer.programs.eval).lower(state, trainer.layout.place_batch(val[0]), rng).compile()
client.wait_at_barrier("eval_compiled", 600_000)
offered = val if process_id == 0 else val[:2]
result = evaluate(trainer.programs.eval, state, iter(offered), 3, rng, place_batch=trainer.layout.place_batch)
grid = ImageGrid(np.zeros((4, 8, 8, 1), np.float32))
hosted = Evaluation.hosted(int(state.step), result, {"samples": grid})
np.savez(
    out,
    allow_pickle=True,  # savez's default, named so that no array binds to it
    losses=np.array(losses),
    moved=np.array(moved),
    step=np.array(int(state.step)),
    eval_batches=np.array(result["num_batches"]),
    eval_loss=np.array(result["loss"]),
    hosted_previews=np.array(len(hosted.previews)),
    **flat,
)
jax.distributed.shutdown()
