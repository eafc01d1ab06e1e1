"""``config.train.steps_per_call``: several train steps per call of the compiled program give the
run of single steps (states bit for bit, the same metric rows), also across a resume that starts
inside a call's span."""

from __future__ import annotations

import numpy as np
from helpers_cli import rows
from helpers_common import ROOT
from test_training import assert_states_identical

from dew.config import apply_overrides, load_config
from dew.training.trainer import Trainer

LOG_EVERY = 10


def mixture(workdir, num_steps: int, steps_per_call: int):
    overrides = {
        "model.width": 16,
        "model.blocks": 1,
        "dataset.batch_size": 32,
        "train.num_steps": num_steps,
        "train.log_every": LOG_EVERY,
        "train.steps_per_call": steps_per_call,
        "checkpoint.every": 15,
        "checkpoint.keep_best": False,
        "eval.every": 0,
        "preview.every": 0,
        "mesh.devices": 1,
    }
    config = apply_overrides(
        load_config(str(ROOT / "experiments" / "mixture2d.py")),
        [f"config.{k}={v}" for k, v in overrides.items()],
    )
    return Trainer(config, str(workdir))


def test_four_steps_per_call_resumed_mid_span_equal_single_steps(tmp_path):
    ends = {}
    for k in (1, 4):  # with 4: calls 0-4-8, single steps to 10, 10-14, 15 (saved); 15-19, 20, ...
        first = mixture(tmp_path / f"k{k}", 15, k).run()
        assert int(first.step) == 15
        resumed = mixture(tmp_path / f"k{k}", 30, k)
        assert resumed.checkpoints is not None and resumed.checkpoints.latest == 15
        ends[k] = resumed.run()
    assert_states_identical(ends[1], ends[4])

    def train_rows(workdir):
        return [r for r in rows(workdir) if r["category"] == "train"]

    a, b = train_rows(tmp_path / "k1"), train_rows(tmp_path / "k4")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [10, 15, 20, 30]  # 15: the first run's end
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        assert {k: v for k, v in x.items() if isinstance(v, str)} == {
            k: v for k, v in y.items() if isinstance(v, str)
        }
        for key in (k for k, v in x.items() if not isinstance(v, str)):
            # Window sums of the same positive float32 values, added in another grouping: each
            # addition rounds by at most eps, so the means differ by at most LOG_EVERY eps.
            np.testing.assert_allclose(
                y[key], x[key], rtol=LOG_EVERY * float(np.finfo(np.float32).eps), err_msg=key
            )
