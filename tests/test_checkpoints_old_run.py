"""A run directory written by 0a2f708's code (``data/run_0a2f708``: ``checkpoints/3`` and
``run.json``, written before checkpointing was regrouped and before ``TrainState`` moved to the
contracts package) restores as it was stored: the state and its EMA law, the data position, the
caller's dataset state, the debiased EMA, the metrics and checksums, and the run's records, which
the restore policy reads to carry the data position over to another batch size."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import jax
import numpy as np

from dew.averaging import ema as ema_lib
from dew.checkpointing import Checkpoints
from dew.checkpointing.restore import RestorePolicy
from dew.checkpointing.settings import CheckpointSettings
from dew.data.dataset import DataPartition
from dew.run_records import read_run, starts, writer_of

sys.path.insert(0, str(pathlib.Path(__file__).parent / "data"))
from make_checkpoint_729b5ab import tiny_state
from make_run_0a2f708 import CONFIG, DATASET_STATE, EMA, POSITION, TIME

OLD_RUN = pathlib.Path(__file__).parent / "data" / "run_0a2f708"


def same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def copied(tmp_path) -> pathlib.Path:
    shutil.copytree(OLD_RUN, tmp_path / "run")
    return tmp_path / "run"


def test_the_stored_checkpoint_restores_state_position_dataset_state_and_ema(tmp_path):
    c = Checkpoints(str(copied(tmp_path) / "checkpoints"), read_only=True)
    assert c.all_steps() == [3] and c.metrics(3) == {"loss": 0.25} and c.ema_record(3) == EMA
    c.verify(3)  # its checksums, as written
    state, position = c.resume(tiny_state(0), share=DataPartition(0, 1))
    law = ema_lib.law(ema_lib.EMASpec(decay=0.9), state.params)
    assert same(state, tiny_state(3).replace(ema_law=law))
    assert position is not None and json.loads(position) == POSITION
    dataset = c.restore_dataset_state(
        {"epoch": 0, "name": "", "seen": np.int64(0), "order": np.zeros(4, np.int32)}, 3
    )
    assert dataset["epoch"] == 1 and dataset["name"] == "digits"
    assert type(dataset["seen"]) is np.int64 and dataset["seen"] == 42
    assert dataset["order"].dtype == np.int32 and np.array_equal(dataset["order"], DATASET_STATE["order"])
    # float32: 3 roundings in 0.9**3 and a few more in the product and the division
    float32_rounding = 8 * 2**-24 / (1 - 0.9**3)
    np.testing.assert_allclose(
        c.restore_ema(None)["w"], 0.25 * tiny_state(3).params["w"] / (1 - 0.9**3), rtol=float32_rounding
    )


def test_the_stored_run_records_read_back_as_written(tmp_path):
    workdir = str(copied(tmp_path))
    run = read_run(workdir)
    assert run is not None and run["ema"] == EMA
    [start] = starts(workdir)
    assert start["time"] == TIME and start["config"] == CONFIG and start["processes"] == 1
    assert writer_of(workdir, 3) == start and writer_of(workdir, 0) is None


class Stream:
    """The training data as the restore policy sees it: its share, epoch length and position."""

    share = DataPartition(0, 1)
    batches_per_epoch = 100

    def __init__(self):
        self.position: dict | None = None

    def read_position(self, saved: bytes, /) -> None:
        self.position = json.loads(saved)


def test_the_restore_policy_resumes_the_stored_run_at_another_batch_size(tmp_path):
    """run.json says step 3 was written with batch size 4; resumed with 2, the position (batch 3
    of 4: 12 examples in) is carried over by example index to batch 6."""
    workdir = str(copied(tmp_path))
    settings = CheckpointSettings(asynchronous=False, keep=None)
    config = {**CONFIG, "dataset": {"batch_size": 2}}
    policy = RestorePolicy(settings.checkpoints(workdir), settings, workdir, config, batch_size=2)
    data = Stream()
    state = policy.initial_state(lambda: tiny_state(0), lambda: tiny_state(0), data)
    assert policy.restored_step == 3 and same(state.params, tiny_state(3).params)
    assert data.position == {"epoch": 0, "batch": 6}


def test_a_step_written_today_records_what_the_stored_step_records(tmp_path):
    """The on-disk format is unchanged: the same save today writes the same items, and orbax's
    step metadata records the same handler for each and the same dew record."""
    c = Checkpoints(str(tmp_path / "new"), keep=None, asynchronous=False, ema=EMA)
    state = tiny_state(3)
    state = state.replace(ema_law=ema_lib.law(ema_lib.EMASpec(decay=0.9), state.params))
    position = json.dumps(POSITION).encode()
    c.save(3, state, position, {"loss": 0.25}, share=DataPartition(0, 1), dataset_state=DATASET_STATE)
    c.close()

    def recorded(step_dir: pathlib.Path) -> tuple[list[str], dict, dict]:
        meta = json.loads((step_dir / "_CHECKPOINT_METADATA").read_text())
        items = sorted(p.name for p in step_dir.iterdir() if p.is_dir())
        return items, meta["item_handlers"], meta["custom_metadata"]

    assert recorded(tmp_path / "new" / "3") == recorded(OLD_RUN / "checkpoints" / "3")
