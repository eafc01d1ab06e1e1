"""One of two real JAX processes (CPU, gloo collectives) saving and restoring checkpoints.

    python tests/helpers_checkpoint_multiprocess.py PROCESS_ID PORT WORKDIR

Each process has 4 CPU devices; together they hold a state on a 4x2 mesh of all 8. Both save a
persistent checkpoint (step 2) and a local one (step 3) with their own data share's position,
then restore: the local step onto the same placement, the persistent step onto the same and
onto an 8x1 mesh, and check that the local step refuses the 8x1 placement. Prints ``ok``.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # only as a process of its own: tests import host_state from here
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew.checkpointing import CheckpointRestorationError, Checkpoints
from dew.data.dataset import DataPartition
from dew.training.state import TrainState


def host_state(step: int) -> TrainState:
    """The full state as numpy: what every process expects to see."""
    params = {
        "w": (np.arange(32, dtype=np.float32).reshape(8, 4) + step),
        "b": np.arange(4, dtype=np.float32) * step,
    }
    opt_state = optax.adam(1e-3).init(params)
    opt_state = jax.tree.map(lambda x: np.asarray(x) + step, opt_state)
    return TrainState(
        step=jnp.asarray(np.int32(step)),
        params=params,
        opt_state=opt_state,
        ema={k: v * 0.5 for k, v in params.items()},
        rng=jnp.asarray(np.array([step, 7], np.uint32)),
    )


def placed(state: TrainState, mesh: jax.sharding.Mesh, spec: jax.P) -> TrainState:
    def put(x):
        x = np.asarray(x)
        sharding = jax.sharding.NamedSharding(mesh, spec if x.ndim == 2 else jax.P())
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, state)


def abstract(state: TrainState) -> TrainState:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def assert_holds(restored: TrainState, expected: TrainState) -> None:
    """Every shard this process holds equals the matching part of the expected state."""
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected), strict=True):
        for shard in got.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(want)[shard.index])


def main(pid: int, port: int, workdir: str) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    assert jax.device_count() == 8 and jax.local_device_count() == 4
    axis_types = (jax.sharding.AxisType.Auto,) * 2
    mesh_4x2 = jax.make_mesh((4, 2), ("data", "model"), axis_types=axis_types)
    mesh_8x1 = jax.make_mesh((8, 1), ("data", "model"), axis_types=axis_types)
    share = DataPartition(pid, 2)
    checkpoints = Checkpoints(
        os.path.join(workdir, "checkpoints"), local_directory=os.path.join(workdir, "local"), local_every=1
    )
    checkpoints.save(
        2, placed(host_state(2), mesh_4x2, jax.P("data", "model")), f'{{"p": {pid}}}'.encode(), share=share
    )
    checkpoints.save_local(
        3, placed(host_state(3), mesh_4x2, jax.P("data", "model")), f'{{"q": {pid}}}'.encode(), share=share
    )
    checkpoints.wait()

    assert checkpoints.latest == 3, checkpoints.latest  # the local step, held by every process
    assert checkpoints.source(3) == os.path.join(workdir, "local", f"process_{pid}", "3")
    assert checkpoints.source(2) == os.path.join(workdir, "checkpoints", "2")

    same = abstract(placed(host_state(0), mesh_4x2, jax.P("data", "model")))
    state, position = checkpoints.restore(same, share=share)
    assert position == f'{{"q": {pid}}}'.encode(), position
    assert_holds(state, host_state(3))
    assert state.params["w"].sharding == same.params["w"].sharding

    state, position = checkpoints.restore(same, step=2, share=share)
    assert position == f'{{"p": {pid}}}'.encode(), position
    assert_holds(state, host_state(2))

    other = abstract(placed(host_state(0), mesh_8x1, jax.P("data", None)))
    state, _ = checkpoints.restore(other, step=2)
    assert_holds(state, host_state(2))
    assert state.params["w"].sharding == other.params["w"].sharding
    try:
        checkpoints.restore(other, step=3)
    except CheckpointRestorationError as e:
        assert "only in the local directories" in str(e), e
    else:
        raise AssertionError("a local checkpoint restored onto another placement")
    checkpoints.close()
    print("ok", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
