"""Checkpoints on real orbax directories: retention, the items, positions, meshes, errors."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.checkpointing import (
    CheckpointRestorationError,
    Checkpoints,
    CheckpointWriteError,
    read_run_metadata,
    save_run_metadata,
)
from dew.data.dataset import DataPartition
from dew.training import get_debiased_ema
from dew.training.state import TrainState

OPTIMIZER = optax.adam(1e-3)
POSITION = b'{"batch": 3, "epoch": 1}'


def state_at(step: int, pending: bool = False) -> TrainState:
    params = {"w": jnp.full((8, 4), float(step)), "b": jnp.arange(4.0) + step}
    return TrainState(
        step=jnp.int32(step),
        params=params,
        opt_state=OPTIMIZER.init(params),
        ema=jax.tree.map(lambda x: 0.5 * x, params),
        rng=jax.random.PRNGKey(step),
        pending=jax.tree.map(lambda x: x + 0.25, params) if pending else None,
    )


TEMPLATE = jax.eval_shape(lambda: state_at(0))


def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))


def placed(state: TrainState, m: jax.sharding.Mesh, spec: jax.P) -> TrainState:
    """Every 2-d leaf sharded by ``spec``, everything else replicated, on mesh ``m``."""

    def put(x):
        sharding = jax.sharding.NamedSharding(m, spec if np.ndim(x) == 2 else jax.P())
        return jax.device_put(x, sharding)

    return jax.tree.map(put, state)


def abstract(state: TrainState) -> TrainState:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def assert_same(a: TrainState, b: TrainState) -> None:
    for field in ("step", "params", "opt_state", "ema", "rng", "pending"):
        la, lb = jax.tree.leaves(getattr(a, field)), jax.tree.leaves(getattr(b, field))
        assert len(la) == len(lb), field
        for x, y in zip(la, lb, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=field)


# --- retention ---------------------------------------------------------------------------------
def test_keeps_the_latest_steps_plus_the_best_and_metricless_saves_never_become_best(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "checkpoints"), keep=2)
    for step, loss in [(1, 0.3), (2, 0.9), (3, None), (4, 0.8), (5, None)]:
        checkpoints.save(step, state_at(step), None, None if loss is None else {"loss": loss})
    checkpoints.wait()
    assert checkpoints.all_steps() == [1, 4, 5]
    assert checkpoints.latest == 5  # the best is old, latest does not go backwards
    assert checkpoints.best == 1
    reopened = Checkpoints(str(tmp_path / "checkpoints"), keep=2)
    assert (reopened.latest, reopened.best) == (5, 1)


def test_keep_best_false_keeps_only_the_latest(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"), keep=2, keep_best=False)
    for step, loss in [(1, 0.1), (2, 0.9), (3, 0.8)]:
        checkpoints.save(step, state_at(step), None, {"loss": loss})
    assert checkpoints.all_steps() == [2, 3]


def test_no_metrics_anywhere_means_no_best(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"), keep=3)
    checkpoints.save(1, state_at(1), None)
    checkpoints.wait()
    assert checkpoints.best is None and checkpoints.latest == 1


# --- restore -----------------------------------------------------------------------------------
def test_restore_with_a_template_returns_the_saved_state_and_the_shares_position(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(7, state_at(7), POSITION, {"loss": 1.0}, share=DataPartition())
    state, position = checkpoints.restore(TEMPLATE, share=DataPartition())
    assert position == POSITION
    assert_same(state, state_at(7))
    assert isinstance(state.params["w"], jax.Array)
    _, no_share = checkpoints.restore(TEMPLATE)
    assert no_share is None  # a caller that reads weights and no data
    with pytest.raises(
        CheckpointRestorationError, match=r"no data position for share 1/2; stored shares are \['0/1'\]"
    ):
        checkpoints.restore(TEMPLATE, share=DataPartition(1, 2))


def test_a_position_without_its_share_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs the share that read it"):
        Checkpoints(str(tmp_path / "c")).save(1, state_at(1), POSITION)


def test_a_shares_offset_comes_back_for_that_share(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(1, state_at(1), b'{"batch": 1, "epoch": 0}\x00', share=DataPartition(1, 2))
    _, position = checkpoints.restore(TEMPLATE, share=DataPartition(1, 2))
    assert position == b'{"batch": 1, "epoch": 0}\x00'  # the length keeps trailing bytes apart from padding


def test_restore_without_template_gives_host_arrays_and_ema_restores_debiased(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(2, state_at(2), None)
    state, position = checkpoints.restore(None, share=DataPartition())
    assert position is None  # the checkpoint stored no position
    assert isinstance(state.params["w"], np.ndarray) and isinstance(state.rng, np.ndarray)
    assert_same(state, state_at(2))
    ema = checkpoints.restore_ema(TEMPLATE.params, decay=0.9)
    np.testing.assert_allclose(ema["w"], get_debiased_ema(state_at(2).ema, 0.9, 2)["w"], rtol=1e-6)
    np.testing.assert_allclose(ema["w"], 0.5 * 2.0 / (1 - 0.9**2), rtol=1e-6)


def test_restore_ema_reads_only_the_ema_and_extra_items(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(3, state_at(3), None)
    checkpoints.wait()
    for item in ("params", "opt_state"):  # what restore_ema must never touch
        for path in data_files(tmp_path / "c" / "3", item):
            path.write_bytes(b"garbage")
    ema = checkpoints.restore_ema(None, decay=0.5)
    np.testing.assert_allclose(ema["b"], (0.5 * (np.arange(4.0) + 3)) / (1 - 0.5**3), rtol=1e-6)
    with pytest.raises(CheckpointRestorationError, match=r"step 3 .* damaged: item 'params'"):
        checkpoints.restore(TEMPLATE)


def test_restoring_what_is_not_there_is_a_named_error(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    with pytest.raises(CheckpointRestorationError, match="no checkpoint in"):
        checkpoints.restore(TEMPLATE)
    with pytest.raises(ValueError, match="no checkpoint in"):  # stix: restore_ema raises ValueError
        checkpoints.restore_ema(TEMPLATE.params, decay=0.9)
    checkpoints.save(1, state_at(1), None)
    with pytest.raises(
        CheckpointRestorationError, match=r"no checkpoint for step 9 .* stored steps are \[1\]"
    ):
        checkpoints.restore(TEMPLATE, step=9)


def test_a_step_that_disagrees_with_the_state_is_refused_at_the_call_and_loses_no_save(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))  # asynchronous
    checkpoints.save(2, state_at(2), None)
    with pytest.raises(ValueError, match="step 4 but the state is at step 3"):
        checkpoints.save(4, state_at(3), None)  # refused before anything is queued
    checkpoints.save(3, state_at(3), None)  # the next save is not the one that pays for it
    checkpoints.wait()
    assert checkpoints.all_steps() == [2, 3]


def test_saving_a_step_twice_is_an_error_not_a_silent_skip(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(2, state_at(2), None)
    with pytest.raises(CheckpointWriteError, match="step 2 was not written"):  # at the call, not later
        checkpoints.save(2, state_at(2), None)
    checkpoints.wait()


def test_a_step_count_that_disagrees_with_the_checkpoint_metadata_raises(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(5, state_at(5), None)
    checkpoints.wait()
    meta_path = tmp_path / "c" / "5" / "_CHECKPOINT_METADATA"
    meta = json.loads(meta_path.read_text())
    meta["custom_metadata"]["num_steps"] = 6
    meta_path.write_text(json.dumps(meta))
    reopened = Checkpoints(str(tmp_path / "c"))
    with pytest.raises(ValueError, match="restored state is at step 5, its metadata records step 6"):
        reopened.restore(TEMPLATE, step=5)
    meta["custom_metadata"].update(num_steps=5, step=6)  # the key it records is another step's
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="its metadata records step 5 under key 6"):
        Checkpoints(str(tmp_path / "c")).restore(TEMPLATE, step=5)


def test_resume_flags_keep_the_fresh_optimizer_state_and_rng(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    fresh = state_at(0)
    assert checkpoints.resume(fresh)[0] is fresh  # nothing stored: the input comes back unchanged
    saved = state_at(4)
    saved = saved.replace(opt_state=jax.tree.map(lambda x: x + 1, saved.opt_state))
    checkpoints.save(4, saved, None)
    both, _ = checkpoints.resume(fresh)
    assert_same(both, saved)
    for path in data_files(tmp_path / "c" / "4", "opt_state"):
        path.write_bytes(b"garbage")  # with restore_optimizer_state=False it is never read
    kept, _ = checkpoints.resume(fresh, restore_optimizer_state=False, restore_rng_key=False)
    jax.tree.map(np.testing.assert_array_equal, kept.opt_state, fresh.opt_state)
    np.testing.assert_array_equal(kept.rng, fresh.rng)
    jax.tree.map(np.testing.assert_array_equal, kept.params, saved.params)
    assert int(kept.step) == 4


# --- meshes ------------------------------------------------------------------------------------
def test_a_checkpoint_written_on_a_4x2_mesh_restores_onto_8x1_and_onto_one_device(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    on_4x2 = placed(state_at(3), mesh((4, 2), ("data", "model")), jax.P("data", "model"))
    assert len(on_4x2.params["w"].sharding.device_set) == 8
    checkpoints.save(3, on_4x2, None)

    target_8x1 = abstract(placed(state_at(0), mesh((8, 1), ("data", "model")), jax.P("data", None)))
    on_8x1, _ = checkpoints.restore(target_8x1)
    assert on_8x1.params["w"].sharding == target_8x1.params["w"].sharding
    assert_same(on_8x1, state_at(3))

    one = jax.sharding.SingleDeviceSharding(jax.devices()[5])
    target_1 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), TEMPLATE)
    on_1, _ = checkpoints.restore(target_1)
    assert on_1.params["w"].sharding == one and on_1.opt_state[0].mu["w"].sharding == one
    assert_same(on_1, state_at(3))


def test_stored_and_accumulation_template_read_no_values(tmp_path, monkeypatch):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(1, state_at(1), None)
    checkpoints.save(2, state_at(2, pending=True), None)
    checkpoints.wait()

    def no_values(*args, **kwargs):
        raise AssertionError("values were read")

    monkeypatch.setattr(checkpoints.store.manager(), "restore", no_values)  # the only path that reads values
    stored = checkpoints.stored(1)
    assert stored.params["w"] == jax.ShapeDtypeStruct((8, 4), jnp.float32)
    assert stored.opt_state[0]["mu"]["b"] == jax.ShapeDtypeStruct((4,), jnp.float32)
    assert stored.rng == jax.ShapeDtypeStruct((2,), jnp.uint32) and stored.pending is None
    assert checkpoints.accumulation_template(1) is None
    pending = checkpoints.accumulation_template(2)
    assert pending == {
        "b": jax.ShapeDtypeStruct((4,), jnp.float32),
        "w": jax.ShapeDtypeStruct((8, 4), jnp.float32),
    }


def test_pending_accumulation_round_trips_and_a_template_without_it_is_refused(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(2, state_at(2, pending=True), None)
    template = TEMPLATE.replace(pending=checkpoints.accumulation_template(2))
    state, _ = checkpoints.restore(template)
    assert_same(state, state_at(2, pending=True))
    with pytest.raises(CheckpointRestorationError, match="unfinished gradient accumulation"):
        checkpoints.restore(TEMPLATE)


# --- damaged checkpoints and mismatched templates ------------------------------------------------
def data_files(root: pathlib.Path, item: str) -> list[pathlib.Path]:
    """The files holding an item's array bytes: OCDBT's ``d/`` files, or the chunks beside each
    leaf's ``.zarray`` (orbax's per-leaf zarr format, what a small state is written in)."""
    return sorted(
        p
        for p in (root / item).rglob("*")
        if p.is_file()
        and (p.parent.name == "d" or ((p.parent / ".zarray").is_file() and not p.name.startswith(".")))
    )


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_a_truncated_or_corrupted_checkpoint_names_the_step_and_the_item(tmp_path, damage):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(3, state_at(3), None)
    checkpoints.wait()
    for path in data_files(tmp_path / "c" / "3", "ema_params"):
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else bytes(b ^ 0x5A for b in raw))
    reopened = Checkpoints(str(tmp_path / "c"))
    with pytest.raises(CheckpointRestorationError, match=r"checkpoint step 3 .* damaged: item 'ema_params'"):
        reopened.restore(TEMPLATE)


def test_a_checkpoint_missing_its_metadata_names_the_step(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(3, state_at(3), None)
    checkpoints.wait()
    (tmp_path / "c" / "3" / "params" / "_METADATA").unlink()
    with pytest.raises(CheckpointRestorationError, match=r"checkpoint step 3 .* damaged"):
        Checkpoints(str(tmp_path / "c")).restore(TEMPLATE)


def test_a_template_that_differs_lists_every_differing_leaf(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"))
    checkpoints.save(1, state_at(1), None)
    params = {
        "w": jax.ShapeDtypeStruct((8, 5), jnp.float32),
        "extra": jax.ShapeDtypeStruct((2,), jnp.float32),
    }
    template = TEMPLATE.replace(params=params, rng=jax.ShapeDtypeStruct((2,), jnp.int32))
    with pytest.raises(CheckpointRestorationError) as error:
        checkpoints.restore(template)
    message = str(error.value)
    assert "checkpoint step 1: the template differs from what is stored in 4 leaves" in message
    assert "params.b: in the checkpoint, not in the template" in message
    assert "params.extra: in the template, not in the checkpoint" in message
    assert "params.w: template shape (8, 5), stored (8, 4)" in message
    assert "extra.rng: template dtype int32, stored uint32" in message


# --- failures surface ----------------------------------------------------------------------------
def test_uploads_run_after_each_save_lands_and_a_failed_upload_surfaces_from_wait(tmp_path):
    seen = []

    def upload(path: str) -> concurrent.futures.Future:
        seen.append((path, os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA"))))
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(None)
        return future

    checkpoints = Checkpoints(str(tmp_path / "c"), upload=upload)
    checkpoints.save(1, state_at(1), None)
    checkpoints.save(2, state_at(2), None)
    checkpoints.wait()
    assert seen == [(str(tmp_path / "c" / "1"), True), (str(tmp_path / "c" / "2"), True)]

    def broken(path: str) -> None:
        raise OSError(f"upload of {path} refused")

    failing = Checkpoints(str(tmp_path / "d"), upload=broken)
    failing.save(1, state_at(1), None)
    with pytest.raises(OSError, match=r"upload of .* refused"):
        failing.wait()


def test_no_pickle_is_written_or_read(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")

    for name in ("dump", "dumps", "load", "loads", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    checkpoints = Checkpoints(str(tmp_path / "c"), local_directory=str(tmp_path / "local"), local_every=1)
    checkpoints.save(1, state_at(1, pending=True), POSITION, {"loss": 1.0}, share=DataPartition())
    checkpoints.save_local(2, state_at(2), POSITION, share=DataPartition())
    checkpoints.wait()
    template = TEMPLATE.replace(pending=checkpoints.accumulation_template(1))
    checkpoints.restore(template, step=1, share=DataPartition())
    checkpoints.restore(TEMPLATE, step=2, share=DataPartition())
    checkpoints.restore_ema(None, step=1, decay=0.9)
    checkpoints.stored(1)
    for path in tmp_path.rglob("*"):  # every file is JSON or raw array data, none a pickle stream
        if path.is_file():
            head = path.read_bytes()[:2]
            assert not (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")), path


# --- local checkpoints ---------------------------------------------------------------------------
def test_a_local_checkpoint_is_the_latest_and_restores_onto_its_own_placement(tmp_path):
    checkpoints = Checkpoints(
        str(tmp_path / "c"), keep=1, local_directory=str(tmp_path / "local"), local_every=1
    )
    m = mesh((4, 2), ("data", "model"))
    checkpoints.save(2, placed(state_at(2), m, jax.P("data", "model")), POSITION, share=DataPartition())
    checkpoints.save_local(
        3, placed(state_at(3), m, jax.P("data", "model")), b'{"n": 3}', share=DataPartition()
    )
    checkpoints.save_local(
        4, placed(state_at(4), m, jax.P("data", "model")), b'{"n": 4}', share=DataPartition()
    )
    checkpoints.wait()
    assert checkpoints.local_path == str(tmp_path / "local" / "process_0")
    assert sorted(os.listdir(checkpoints.local_path)) == ["4"]  # one local step, in place of the one before
    assert checkpoints.latest == 4 and checkpoints.all_steps() == [2]
    assert checkpoints.source(4) == str(tmp_path / "local" / "process_0" / "4")
    assert checkpoints.source(2) == str(tmp_path / "c" / "2")

    template = abstract(placed(state_at(0), m, jax.P("data", "model")))
    state, position = checkpoints.restore(template, share=DataPartition())
    assert position == b'{"n": 4}'
    assert_same(state, state_at(4))
    assert state.params["w"].sharding == template.params["w"].sharding
    host, _ = checkpoints.restore(None)  # one process holds every shard: host arrays assemble
    assert_same(host, state_at(4))
    assert checkpoints.stored(4).params["w"] == jax.ShapeDtypeStruct((8, 4), jnp.float32)


def test_a_local_checkpoint_onto_another_placement_raises_before_reading_shards(tmp_path):
    local = tmp_path / "local"
    checkpoints = Checkpoints(str(tmp_path / "c"), local_directory=str(local), local_every=1)
    m = mesh((4, 2), ("data", "model"))
    checkpoints.save(3, placed(state_at(3), m, jax.P("data", "model")), None)
    checkpoints.save_local(5, placed(state_at(5), m, jax.P("data", "model")), None)
    checkpoints.wait()
    shards = sorted((local / "process_0" / "5").glob("leaf*.shard*.npy"))
    assert len(shards) >= 8  # the damage below must hit the files a read would open
    for path in shards:
        path.unlink()  # a read of any shard would now fail with a different error
    other = abstract(placed(state_at(0), mesh((8, 1), ("data", "model")), jax.P("data", None)))
    with pytest.raises(
        CheckpointRestorationError,
        match=r"step 5 is only in the local directories .* leaf '\w+\.w' was written as",
    ):
        checkpoints.restore(other)
    # a step the persistent directory holds restores onto any placement
    state, _ = checkpoints.restore(other, step=3)
    assert_same(state, state_at(3))


@pytest.mark.parametrize(
    "optimizer",
    [
        optax.adam(1e-3),  # a tuple of a namedtuple and an empty node
        optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)),
        optax.sgd(1e-3),  # no arrays at all: an unset field
    ],
    ids=["adam", "chain", "sgd"],
)
def test_stored_gives_the_same_nested_shape_dtype_tree_from_the_local_tier_as_from_the_persistent(
    tmp_path, optimizer
):
    def state(step: int) -> TrainState:
        params = {"net": {"w": jnp.full((8, 4), float(step)), "b": jnp.arange(4.0)}, "scale": jnp.ones(())}
        return TrainState(
            step=jnp.int32(step),
            params=params,
            opt_state=optimizer.init(params),
            ema=params,
            rng=jax.random.PRNGKey(step),
            pending={"grads": params},
            power_ema=(params, params),
        )

    checkpoints = Checkpoints(str(tmp_path / "c"), local_directory=str(tmp_path / "local"), local_every=1)
    checkpoints.save(2, state(2), None)
    checkpoints.save_local(3, state(3), None)
    checkpoints.wait()
    assert checkpoints.source(3).startswith(str(tmp_path / "local"))  # step 3 is only local
    persistent, local = checkpoints.stored(2), checkpoints.stored(3)
    assert jax.tree.structure(local) == jax.tree.structure(persistent)
    assert jax.tree.leaves(local) == jax.tree.leaves(persistent)
    assert local.params["net"]["w"] == jax.ShapeDtypeStruct((8, 4), jnp.float32)
    assert local.opt_state == persistent.opt_state and local.power_ema == persistent.power_ema


# --- run metadata --------------------------------------------------------------------------------
def test_run_metadata_is_plain_json_beside_checkpoints(tmp_path):
    assert read_run_metadata(str(tmp_path)) is None
    save_run_metadata(str(tmp_path), {"label": "edm", "config": {"seed": 0}})
    assert read_run_metadata(str(tmp_path)) == {"label": "edm", "config": {"seed": 0}}
    assert json.loads((tmp_path / "run.json").read_text())["label"] == "edm"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"keep must be None \(keep all\) or an int >= 1, got 0"):
        Checkpoints("x", keep=0)
    with pytest.raises(ValueError, match="local_directory and local_every go together"):
        Checkpoints("x", local_directory="y")
    with pytest.raises(ValueError, match="local_every must be an int >= 1, got 0"):
        Checkpoints("x", local_directory="y", local_every=0)


# --- retention that never stops, keep-all, directories as URIs -----------------------------------
def test_saves_without_the_ranked_metric_never_stop_pruning_and_any_metric_name_ranks(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"), keep=2, best_metric="fid")
    reports = [{"fid": 9.0}, None, {"accuracy": 0.5}, {"fid": 3.0, "loss": 7.0}, {}, None, {"loss": 0.1}]
    for step, metrics in enumerate(reports, start=1):
        checkpoints.save(step, state_at(step), None, metrics)
        checkpoints.wait()  # every save lands: none raises, whatever it reported
        kept = checkpoints.all_steps()
        assert len(kept) <= 3, kept  # the latest two plus the best: the directory stays bounded
    assert checkpoints.all_steps() == [4, 6, 7] and checkpoints.best_step() == 4
    assert checkpoints.metrics(4) == {"fid": 3.0, "loss": 7.0} and checkpoints.metrics(6) is None


def test_keep_none_keeps_every_step(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"), keep=None)
    for step in range(1, 6):
        checkpoints.save(step, state_at(step), None, {"loss": float(step)})
    assert checkpoints.all_steps() == [1, 2, 3, 4, 5]


def test_a_file_uri_round_trips_to_the_local_directory_it_names(tmp_path):
    uri = (tmp_path / "under uri").as_uri()  # file:///.../under%20uri
    assert uri.startswith("file:///")
    checkpoints = Checkpoints(uri + "/checkpoints")
    checkpoints.save(3, state_at(3), POSITION, {"loss": 1.0}, share=DataPartition())
    checkpoints.wait()
    assert (tmp_path / "under uri" / "checkpoints" / "3" / "params").is_dir()
    state, position = Checkpoints(uri + "/checkpoints").restore(TEMPLATE, share=DataPartition())
    assert_same(state, state_at(3)) and position == POSITION
    assert checkpoints.path(3) == str(tmp_path / "under uri" / "checkpoints" / "3")


def test_an_unknown_or_unserved_scheme_is_one_clear_error_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"URI scheme foo://, which orbax's path handling .* does not serve"):
        Checkpoints("foo://bucket/run")
    import importlib.util

    if importlib.util.find_spec("gcsfs") is None and importlib.util.find_spec("tensorflow") is None:
        with pytest.raises(ValueError, match=r"'gs://bucket/run' is on gs://.* install gcsfs or tensorflow"):
            Checkpoints("gs://bucket/run")
    assert list(tmp_path.iterdir()) == []  # never ./gs:/bucket/run


def test_roll_back_moves_newer_steps_aside_or_deletes_them_and_refuses_a_missing_step(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "c"), keep=None)
    for step in (2, 4, 6):
        checkpoints.save(step, state_at(step), None)
    with pytest.raises(CheckpointRestorationError, match="no checkpoint for step 3"):
        checkpoints.roll_back(3)
    assert checkpoints.all_steps() == [2, 4, 6]  # nothing moved before the step was found
    assert checkpoints.roll_back(4) == [6]
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("c.rolled-back-")]
    assert os.listdir(aside) == ["6"] and checkpoints.all_steps() == [2, 4]
    checkpoints.save(6, state_at(6), None)  # the step is free again
    assert checkpoints.roll_back(2, how="delete") == [4, 6]
    assert checkpoints.all_steps() == [2] and len(list(tmp_path.iterdir())) == 2
