"""Write ``tests/data/run_0a2f708``: a tiny run directory written by the code of commit 0a2f708
(checkpointing in 22 modules, ``TrainState`` in ``dew.training.state``, ``run.json`` written by
``dew.checkpointing.run_history``), to prove a later layout of the code restores it as stored.

Run from a checkout of that commit:  PYTHONPATH=. python <this file> <output directory>
The directory holds ``checkpoints/3``: ``tiny_state(3)`` of ``make_checkpoint_729b5ab`` with an
EMA law of constant decay 0.9 carried by the state, the data position ``{"epoch": 0, "batch": 3}``
of share 0 of 1, the caller's dataset state ``DATASET_STATE`` (a Python int and string, a numpy
scalar and a numpy array) and the metric ``loss=0.25``; and ``run.json``, one recorded start
(resumed from 0, one process, the config ``CONFIG``) with the EMA record at its top. The start's
time is then set to ``TIME`` so the file does not depend on when it was written.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_checkpoint_729b5ab import tiny_state

EMA = {"decay": 0.9, "half_life": None, "ramp_up": None, "tracked": None, "accumulation": 1}
CONFIG = {"dataset": {"batch_size": 4}, "model": {"channels": 3}, "train": {"num_steps": 10}}
DATASET_STATE = {"epoch": 1, "name": "digits", "seen": np.int64(42), "order": np.arange(4, dtype=np.int32)}
POSITION = {"epoch": 0, "batch": 3}
TIME = "2026-12-05T03:30:00+00:00"

if __name__ == "__main__":
    from dew.checkpointing.run_history import record_start  # pyright: ignore[reportMissingImports]  # commit 0a2f708's module

    from dew.averaging import ema as ema_lib
    from dew.checkpointing import Checkpoints
    from dew.data.dataset import DataPartition

    workdir = sys.argv[1]
    record_start(workdir, CONFIG, 0, processes=1, extra={"ema": EMA})
    with open(os.path.join(workdir, "run.json")) as f:
        run = json.load(f)
    run["starts"][0]["time"] = TIME
    with open(os.path.join(workdir, "run.json"), "w") as f:
        json.dump(run, f, indent=2, sort_keys=True)
    state = tiny_state(3)
    state = state.replace(ema_law=ema_lib.law(ema_lib.EMASpec(decay=0.9), state.params))
    ckpt = Checkpoints(os.path.join(workdir, "checkpoints"), keep=None, asynchronous=False, ema=EMA)
    position = json.dumps(POSITION).encode()
    share = DataPartition(0, 1)
    ckpt.save(3, state, position, {"loss": 0.25}, share=share, dataset_state=DATASET_STATE)
    ckpt.close()
