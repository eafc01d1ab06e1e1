"""Power-EMA snapshots are checked when read: a damaged record or item, parameters of another
shape, or non-finite parameters are one ``SnapshotError`` naming the file (never a traceback from
orbax, never a silently wrong post-hoc reconstruction)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dew.averaging.power_ema import PowerEMA, PowerEMASnapshots, SnapshotError

POWER = PowerEMA((0.05, 0.1), snapshot_every=1)


def _store(tmp_path, slots_by_step) -> str:
    directory = str(tmp_path / "power_ema")
    store = PowerEMASnapshots(directory)
    for step, slots in slots_by_step.items():
        store.save(step, step, POWER, slots)
    store.close()
    return directory


def _slots(value: float, shape=(3,)):
    return [{"w": np.full(shape, value, np.float32)}, {"w": np.full(shape, 2 * value, np.float32)}]


def _read(directory):
    store = PowerEMASnapshots(directory, read_only=True)
    try:
        return store.snapshots()
    finally:
        store.close()


def test_intact_snapshots_read_back(tmp_path):
    directory = _store(tmp_path, {1: _slots(1.0), 2: _slots(3.0)})
    snapshots = _read(directory)
    assert [(s.t, s.std_rel) for s in snapshots] == [(1, 0.05), (1, 0.1), (2, 0.05), (2, 0.1)]
    np.testing.assert_array_equal(snapshots[3].params["w"], np.full(3, 6.0, np.float32))


@pytest.mark.parametrize(
    ("custom", "message"),
    [
        ({"updates": -1, "std_rels": [0.05, 0.1]}, r"updates=-1, not an int >= 0"),
        ({"updates": "2", "std_rels": [0.05, 0.1]}, r"updates='2', not an int >= 0"),
        ({"updates": 2, "std_rels": []}, r"std_rels=\[\]"),
        ({"updates": 2, "std_rels": ["x"]}, r"std_rels=\['x'\]"),
        ({"updates": 2}, r"std_rels=None"),
        (None, "holds no custom_metadata object"),
    ],
)
def test_a_damaged_record_names_the_file(tmp_path, custom, message):
    directory = _store(tmp_path, {1: _slots(1.0), 2: _slots(3.0)})
    path = os.path.join(directory, "2", "_CHECKPOINT_METADATA")
    with open(path) as f:
        record = json.load(f)
    record["custom_metadata"] = custom
    with open(path, "w") as f:
        json.dump(record, f)
    with pytest.raises(SnapshotError, match=message) as raised:
        _read(directory)
    assert path in str(raised.value)


def test_a_record_that_is_not_json_names_the_file(tmp_path):
    directory = _store(tmp_path, {1: _slots(1.0)})
    path = os.path.join(directory, "1", "_CHECKPOINT_METADATA")
    with open(path, "w") as f:
        f.write("{torn")
    with pytest.raises(SnapshotError, match="cannot be read") as raised:
        _read(directory)
    assert path in str(raised.value)


def test_a_missing_item_names_the_snapshot(tmp_path):
    import shutil

    directory = _store(tmp_path, {1: _slots(1.0), 2: _slots(3.0)})
    shutil.rmtree(os.path.join(directory, "2", "std_rel_0.100"))
    with pytest.raises(SnapshotError, match=r"power-EMA snapshot .*/2 cannot be read"):
        _read(directory)


def test_parameters_of_another_shape_or_not_finite_are_refused(tmp_path):
    directory = _store(tmp_path / "a", {1: _slots(1.0), 2: _slots(3.0, shape=(4,))})
    with pytest.raises(SnapshotError, match=r"2/std_rel_0.050 does not match the run's other snapshots"):
        _read(directory)
    directory = _store(tmp_path / "b", {1: _slots(1.0), 2: _slots(float("nan"))})
    with pytest.raises(SnapshotError, match=r"2/std_rel_0.050 holds non-finite parameters"):
        _read(directory)
