"""Two real JAX processes on localhost save persistent and local checkpoints and restore them;
the persistent one then restores in a single process onto one device."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers_common import ROOT

from dew.checkpointing import CheckpointRestorationError, Checkpoints
from dew.data.dataset import DataPartition

HELPER = str(ROOT / "tests" / "helpers_checkpoint_multiprocess.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_save_and_restore_and_the_persistent_checkpoint_moves_to_one_device(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, HELPER, str(pid), str(port), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for pid in (0, 1)
    ]
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outputs.append((proc.returncode, out, err))
    for code, out, err in outputs:
        assert code == 0 and out.strip().endswith("ok"), err[-3000:]

    # Each process wrote its own local directory; the rows of both shares sit in one checkpoint.
    assert sorted(os.listdir(tmp_path / "local")) == ["process_0", "process_1"]
    from helpers_checkpoint_multiprocess import host_state

    checkpoints = Checkpoints(
        str(tmp_path / "checkpoints"), local_directory=str(tmp_path / "local"), local_every=1
    )
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    template = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=one), host_state(0)
    )
    state, position = checkpoints.restore(template, step=2, share=DataPartition(1, 2))
    assert position == b'{"p": 1}'
    assert state.params["w"].sharding == one
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(host_state(2)), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    host, position = checkpoints.restore(None, step=2, share=DataPartition(0, 2))
    assert position == b'{"p": 0}' and isinstance(host.params["w"], np.ndarray)

    # The local step 3 was written by process 0 of 2: this single process holds no such shards.
    assert checkpoints.latest == 3
    with pytest.raises(CheckpointRestorationError, match="written by process 0 of 2, this is process 0 of 1"):
        checkpoints.restore(template)
