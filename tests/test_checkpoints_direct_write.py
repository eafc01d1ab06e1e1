"""A small state's step written by dew itself (``direct_write``): the same files orbax writes without
OCDBT, byte for byte but for timestamps; read by orbax and by every dew restore path, sharded or
not; checksummed; a cut-short write leaves no step; larger states and URIs go to orbax."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from etils import epath

from dew.checkpointing import Checkpoints, direct_write
from dew.checkpointing.errors import CheckpointDamagedError, CheckpointWriteError
from dew.checkpointing.step_files import CHECKSUMS
from dew.checkpointing.store import Store
from dew.data.dataset import DataPartition

sys.path.insert(0, str(pathlib.Path(__file__).parent / "data"))
from make_checkpoint_729b5ab import tiny_state

EMA = {"decay": 0.9, "half_life": None, "ramp_up": None, "tracked": None, "accumulation": 1}
POSITION = json.dumps({"epoch": 1, "batch": 7}).encode()


def files(root: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def save(path: pathlib.Path, state, ocdbt: bool | None, **kwargs) -> Checkpoints:
    c = Checkpoints(str(path), asynchronous=False, ocdbt=ocdbt, ema=EMA, **kwargs)
    c.save(int(state.step), state, POSITION, {"loss": 0.5}, share=DataPartition(0, 1))
    return c


def test_a_small_step_is_the_files_orbax_writes_without_ocdbt_byte_for_byte(tmp_path):
    state = tiny_state(3)
    save(tmp_path / "orbax", state, ocdbt=False).close()
    save(tmp_path / "direct", state, ocdbt=None).close()
    by_orbax, by_dew = files(tmp_path / "orbax" / "3"), files(tmp_path / "direct" / "3")
    assert sorted(by_orbax) == sorted(by_dew)
    assert not any(name.endswith("manifest.ocdbt") for name in by_dew)  # orbax's per-leaf zarr
    # the commit notes name the directory written; the step metadata holds the save's times
    timed = {"_CHECKPOINT_METADATA"} | {n for n in by_dew if n.endswith("commit_success.txt")}
    assert {n for n in by_dew if by_dew[n] != by_orbax[n]} <= timed
    step_orbax, step_dew = (json.loads(f["_CHECKPOINT_METADATA"]) for f in (by_orbax, by_dew))
    for meta in (step_orbax, step_dew):
        assert meta.pop("init_timestamp_nsecs") <= meta.pop("commit_timestamp_nsecs")
    assert step_dew == step_orbax
    assert list(step_dew["item_handlers"]) == list(step_orbax["item_handlers"])


def test_the_default_writes_a_small_state_directly_and_a_larger_one_through_orbax(tmp_path, monkeypatch):
    c = Checkpoints(str(tmp_path / "c"), asynchronous=False, keep=None)
    orbax_save = ocp.CheckpointManager.save
    calls = []
    monkeypatch.setattr(
        ocp.CheckpointManager, "save", lambda self, *a, **k: calls.append(a) or orbax_save(self, *a, **k)
    )
    c.save(1, tiny_state(1), None)
    assert calls == [] and not (tmp_path / "c" / "1" / "params" / "manifest.ocdbt").exists()
    c.close()
    monkeypatch.setattr(direct_write, "SMALL_BYTES", 8)  # the tiny state is "large" now
    c = Checkpoints(str(tmp_path / "c"), asynchronous=False, keep=None)
    c.save(2, tiny_state(2), None)
    c.close()
    assert len(calls) == 1 and (tmp_path / "c" / "2" / "params" / "manifest.ocdbt").exists()
    again = Checkpoints(str(tmp_path / "c"), read_only=True)
    for step in (1, 2):
        again.verify(step)
        assert same(again.restore(step=step)[0].params, tiny_state(step).params)
    kwdefaults = Store.__init__.__kwdefaults__
    assert kwdefaults is not None and kwdefaults["ocdbt"] is None  # chosen by size: benchmarks/checkpoint.py


def test_a_direct_step_restores_through_every_path_and_through_orbax_alone(tmp_path):
    state = tiny_state(4)
    save(tmp_path / "c", state, ocdbt=None).close()
    c = Checkpoints(str(tmp_path / "c"), read_only=True)
    c.verify(4)
    record = c.ema_record(4)
    assert (
        c.all_steps() == [4]
        and c.metrics(4) == {"loss": 0.5}
        and record is not None
        and record["decay"] == 0.9
    )
    restored, position = c.resume(tiny_state(0), share=DataPartition(0, 1))
    assert same(restored.replace(ema_law=None), state) and position == POSITION
    host, _ = c.restore()  # no template: host arrays
    assert same(host.params, state.params) and isinstance(jax.tree.leaves(host.params)[0], np.ndarray)
    float32_rounding = 8 * 2**-24 / (1 - 0.9**4)  # 4 roundings in 0.9**4 and a few in the division
    np.testing.assert_allclose(
        c.restore_ema(None)["w"], 0.25 * state.params["w"] / (1 - 0.9**4), rtol=float32_rounding
    )
    assert c.stored(4).params["w"].shape == (2, 3)
    # orbax alone, its stock handler, reads the item as one of its own
    params = ocp.PyTreeCheckpointer().restore(tmp_path / "c" / "4" / "params")
    assert same(params, state.params)


def test_sharded_leaves_are_written_whole_and_restore_onto_their_placement(tmp_path):
    n = len(jax.devices())
    mesh = jax.make_mesh((n,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    split = jax.sharding.NamedSharding(mesh, jax.P("data"))
    replicated = jax.sharding.NamedSharding(mesh, jax.P())
    params = {
        "w": jax.device_put(jnp.arange(n * 3.0).reshape(n, 3), split),
        "b": jax.device_put(jnp.arange(3.0), replicated),
    }
    state = tiny_state(5).replace(params=params, ema=params, opt_state=optax.adam(1e-3).init(params))
    save(tmp_path / "c", state, ocdbt=None).close()
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored, _ = Checkpoints(str(tmp_path / "c"), read_only=True).resume(template)
    assert same(restored.replace(ema_law=None), state)
    assert restored.params["w"].sharding == split and restored.params["b"].sharding == replicated
    stored = json.loads((tmp_path / "c" / "5" / "params" / "_sharding").read_text())
    assert {json.loads(v)["sharding_type"] for v in stored.values()} == {"NamedSharding"}


def test_every_array_dtype_of_a_state_round_trips(tmp_path):
    state = tiny_state(2)
    params = {
        "w": state.params["w"].astype(jnp.bfloat16),
        "b": state.params["b"] > 0,
        "i": jnp.arange(3, dtype=jnp.int8),
        "h": np.arange(4, dtype=np.float16),  # a host array
    }
    state = state.replace(params=params, ema=params)
    save(tmp_path / "c", state, ocdbt=None).close()
    assert not (tmp_path / "c" / "2" / "params" / "manifest.ocdbt").exists()
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    restored, _ = Checkpoints(str(tmp_path / "c"), read_only=True).resume(template)
    for name, want in params.items():
        assert restored.params[name].dtype == want.dtype and same(restored.params[name], want), name


def test_damage_to_a_direct_step_is_caught_by_its_checksums(tmp_path):
    save(tmp_path / "c", tiny_state(3), ocdbt=None).close()
    chunk = tmp_path / "c" / "3" / "params" / "w" / "0.0"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamagedError, match=r"item 'params'.*w/0\.0"):
        Checkpoints(str(tmp_path / "c"), read_only=True).verify(3)


def test_the_checksums_are_inside_a_direct_step_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    path_type = type(epath.Path(tmp_path))
    rename = path_type.rename
    seen = {}

    def observed(self, target):
        if pathlib.Path(target).name == "3":  # the step's rename
            seen.update({item.name: (item / CHECKSUMS).is_file() for item in self.iterdir() if item.is_dir()})
        return rename(self, target)

    monkeypatch.setattr(path_type, "rename", observed)
    save(tmp_path / "c", tiny_state(3), ocdbt=None).close()
    assert seen == {"params": True, "opt_state": True, "ema_params": True, "extra": True, "data": True}


def test_a_direct_write_cut_short_leaves_no_step_and_the_next_writer_removes_it(tmp_path, monkeypatch):
    c = Checkpoints(str(tmp_path / "c"), asynchronous=False)
    c.save(1, tiny_state(1), None)

    def killed(*args, **kwargs):
        raise OSError("killed mid-write")

    monkeypatch.setattr(direct_write, "write_checksums", killed)
    with pytest.raises(CheckpointWriteError, match="step 2 did not land"):
        c.save(2, tiny_state(2), None)
    c.close()
    assert sorted(os.listdir(tmp_path / "c")) == ["1", "2.orbax-checkpoint-tmp"]
    assert Checkpoints(str(tmp_path / "c"), read_only=True).all_steps() == [1]  # a reader leaves it
    monkeypatch.undo()
    c = Checkpoints(str(tmp_path / "c"), asynchronous=False)
    c.save(3, tiny_state(3), None)  # the next run's first save removes what the kill left
    c.close()
    assert sorted(os.listdir(tmp_path / "c")) == ["1", "3"]


def test_only_a_single_process_state_of_arrays_under_the_limit_is_eligible(monkeypatch):
    small = {"params": {"w": jnp.ones(4)}, "data": {"rows": np.zeros((1, 8), np.uint8)}}
    assert direct_write.eligible(small)
    assert not direct_write.eligible({"dataset": {"name": np.array(["a"])}})  # strings: orbax's
    assert not direct_write.eligible({"dataset": {"epoch": 3}})  # a Python number: orbax's
    monkeypatch.setattr(direct_write, "SMALL_BYTES", 15)
    assert not direct_write.eligible(small)
    monkeypatch.setattr(direct_write, "SMALL_BYTES", 16 + 8)
    assert direct_write.eligible(small)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert not direct_write.eligible(small)
