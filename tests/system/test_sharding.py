"""Sharding on 8 CPU devices: the same run on meshes 1x1, 8x1 and 4x2 gives the same losses and
parameters, the state's arrays carry the requested shardings, and bad input fails before any step."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers_common import tiny_config
from jax.sharding import PartitionSpec

from dew.config import ConfigError
from dew.training.sharding import Layout, MeshSpec
from dew.training.trainer import Trainer


def run_on_mesh(tmp_path, name: str, num_steps: int = 3, **mesh):
    overrides = {"mesh.devices": 0, **{f"mesh.{k}": v for k, v in mesh.items()}}
    trainer = Trainer(tiny_config(**overrides, **{"eval.every": 0}), str(tmp_path / name))
    state = trainer.programs.init(jax.random.PRNGKey(0), trainer.example_batch())
    losses, placements = [], []
    data = iter(trainer.train_data)
    for i in range(num_steps):
        # After the first (compiling) step, no step may move anything from device to host.
        with jax.transfer_guard_device_to_host("allow" if i == 0 else "disallow"):
            state, stats = trainer.step(state, next(data))
        losses.append(stats["loss"])
        placements.append(jax.tree.map(lambda x: x.sharding, state))
    return trainer, state, np.asarray(jax.device_get(losses)), placements


def test_meshes_1x1_8x1_4x2_give_the_same_run_with_the_requested_shardings(tmp_path):
    runs = {
        "1x1": run_on_mesh(tmp_path, "1x1", devices=1),
        "8x1": run_on_mesh(tmp_path, "8x1"),
        "4x2": run_on_mesh(tmp_path, "4x2", model=2),
    }
    assert dict(runs["1x1"][0].mesh.shape) == {"data": 1}
    assert dict(runs["8x1"][0].mesh.shape) == {"data": 8}
    assert dict(runs["4x2"][0].mesh.shape) == {"data": 4, "model": 2}

    _, reference, reference_losses, _ = runs["1x1"]
    for name, (trainer, state, losses, placements) in runs.items():
        np.testing.assert_allclose(losses, reference_losses, rtol=2e-5, err_msg=name)
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-6, err_msg=name)
        # Every step's output state sits exactly where the layout asked, on this mesh's devices.
        expected = trainer.programs.state_shardings
        for placed in placements:
            for got, want in zip(jax.tree.leaves(placed), jax.tree.leaves(expected), strict=True):
                assert got == want, (name, got, want)
        assert all(
            leaf.sharding.mesh.devices.size == trainer.mesh.devices.size for leaf in jax.tree.leaves(state)
        )

    # On 4x2 the model axis really splits kernels (and their Adam moments and EMA) in two.
    trainer, state, _, _ = runs["4x2"]
    split = [p for p in jax.tree.leaves(state.params) if p.sharding.spec and p.sharding.spec[-1] == "model"]
    assert len(split) >= 5
    kernel = split[0]
    assert {s.data.shape[-1] for s in kernel.addressable_shards} == {kernel.shape[-1] // 2}
    moments = [m for m in jax.tree.leaves(state.opt_state) if getattr(m, "ndim", 0) >= 2]
    assert sum(m.sharding.spec[-1:] == ("model",) for m in moments) == 2 * len(split)  # mu and nu
    assert sum(e.sharding.spec[-1:] == ("model",) for e in jax.tree.leaves(state.ema)) == len(split)
    # 8x1: everything replicated, batch split eight ways.
    trainer8 = runs["8x1"][0]
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(runs["8x1"][1]))
    assert trainer8.layout.batch_sharding.spec == PartitionSpec(("data",))


def test_fsdp_layout_splits_each_leaf_over_the_fsdp_axis_and_the_batch_with_it():
    mesh = MeshSpec({"fsdp": 4}).mesh()
    layout = Layout.for_mesh(mesh)
    assert layout.batch_axes == ("data", "fsdp") and layout.data_parallel_size == 8
    params = {
        "w": np.zeros((3, 8, 16), np.float32),
        "b": np.zeros((6,), np.float32),
        "s": np.zeros((), np.float32),
    }
    placed = layout.place(params)
    assert placed["w"].sharding.spec == PartitionSpec(None, None, "fsdp")
    assert placed["b"].sharding.spec == PartitionSpec()  # 6 does not split 4 ways: replicated
    assert placed["s"].sharding.spec == PartitionSpec()


def test_bad_meshes_and_batches_fail_before_any_step(tmp_path):
    with pytest.raises(ValueError, match="take 3 devices, which does not divide the 8 devices"):
        MeshSpec({"model": 3}).mesh()
    with pytest.raises(ConfigError, match="does not divide the 8 devices"):
        Trainer(tiny_config(**{"mesh.model": 3, "mesh.devices": 0}), str(tmp_path / "a"))
    with pytest.raises(
        ConfigError,
        match=r"batch_size size 12 is not divisible by the data-parallel axes \('data',\) of size 8",
    ):
        Trainer(tiny_config(**{"dataset.batch_size": 12, "mesh.devices": 0}), str(tmp_path / "b"))
    with pytest.raises(ConfigError, match=r"config\.mesh\.model=0 is invalid"):
        Trainer(tiny_config(**{"mesh.model": 0, "mesh.devices": 0}), str(tmp_path / "c"))
    with pytest.raises(ValueError, match="cannot split dimension 0"):
        Layout(MeshSpec({"model": 2}).mesh(), rule=lambda path, shape: PartitionSpec("model")).place(
            {"odd": np.zeros((3,), np.float32)}
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
