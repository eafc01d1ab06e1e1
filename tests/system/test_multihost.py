"""Multi-host training is JAX's own multi-controller runtime: two real processes on localhost
(CPU, gloo collectives) train data-parallel and hold identical replicated parameters, then
evaluate a coordinated prefix and host previews on rank zero only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
from helpers_common import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_data_parallel_and_hold_identical_replicated_params(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
    }
    outs = [tmp_path / f"process{i}.npz" for i in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "helpers_multihost_worker.py"),
                str(i),
                str(port),
                str(tmp_path / "run"),
                str(outs[i]),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=1500)[0])  # two compiles on a shared 2-core machine
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{logs[i][-4000:]}"
    a, b = (dict(np.load(o)) for o in outs)
    assert int(a["step"]) == int(b["step"]) == 3
    assert len(a["losses"]) == 3 and np.all(np.isfinite(a["losses"]))
    np.testing.assert_array_equal(a["losses"], b["losses"])  # the loss is of the global batch
    assert float(a["moved"]) > 0  # training changed the parameters
    # evaluate ran the prefix every process had (2 batches, not 3) and agrees on the result;
    # previews are hosted on rank zero only.
    assert int(a["eval_batches"]) == int(b["eval_batches"]) == 2
    assert float(a["eval_loss"]) == float(b["eval_loss"]) and np.isfinite(float(a["eval_loss"]))
    assert (int(a["hosted_previews"]), int(b["hosted_previews"])) == (1, 0)
    params = sorted(k for k in a if k.startswith("["))
    assert params and params == sorted(k for k in b if k.startswith("["))
    for k in params:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
