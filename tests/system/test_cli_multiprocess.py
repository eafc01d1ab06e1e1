"""``python -m dew.main`` as two processes on this machine (CPU, gloo collectives over localhost):
the pair trains; a SIGTERM to one of them stops both at the same step with one checkpoint and
the preemption exit code; the pair relaunched ends bit-identical to a pair that was never
interrupted; the interrupted pair's checkpoint resumes on a single process; and when one process
of a pair is killed outright, or stopped (SIGSTOP), the other stops with one line of dew's, exit 1
and a traceback file, instead of waiting or aborting. Bad input for a process group (a device
count the processes do not divide, an unreachable coordinator, a partial set of flags, process 0
started alone, processes whose configs differ) exits 2 with one line, having written nothing."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from helpers_cli import comparable, complete_rows, dew_stderr, rows, wait_for
from helpers_common import ROOT

from dew.checkpointing import Checkpoints

NUM_STEPS = 60
# The 2D mixture with a one-block MLP: what is tested is the process group's life cycle, the
# same for every network. One CPU device per process; every run shares one compilation cache.
MIXTURE = {
    "dataset.batch_size": 16,
    "model.width": 16,
    "model.blocks": 1,
    "train.num_steps": NUM_STEPS,
    "train.log_every": 2,
    "train.steps_per_call": 1,
    "checkpoint.every": 20,
    "optimizer.warmup_steps": 2,
    "eval.every": 0,
    "preview.every": 0,
    "mesh.devices": 0,
    "runtime.host_devices": 1,
}
PREEMPTED = 128 + signal.SIGTERM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(workdir, cache, *group: str, **overrides) -> list[str]:
    values = {**MIXTURE, "runtime.compilation_cache": cache, **overrides}
    return [
        sys.executable,
        "-m",
        "dew.main",
        f"--config={ROOT / 'experiments' / 'mixture2d.py'}",
        f"--workdir={workdir}",
        *group,
        *(f"--config.{k}={v}" for k, v in values.items()),
    ]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEW_", "SLURM_", "OMPI_"))}
    env.pop("XLA_FLAGS", None)
    return {**env, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}


def launch(
    workdir, cache, processes: int = 2, own: list[dict] | None = None, **overrides
) -> list[subprocess.Popen]:
    """``processes`` processes of one run (one: no flags), started at once; ``own[i]``: config
    overrides of process ``i`` alone."""
    port = free_port()
    flags = [
        [f"--coordinator=127.0.0.1:{port}", f"--num_processes={processes}", f"--process_id={i}"]
        for i in range(processes)
    ]
    own = own or [{}] * processes
    return [
        subprocess.Popen(
            command(workdir, cache, *(flags[i] if processes > 1 else []), **{**overrides, **own[i]}),
            cwd=ROOT,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]


def finish(procs: list[subprocess.Popen], timeout: float = 600) -> list[tuple[int, str, str]]:
    """Each process's (exit status, stdout, stderr); every process is killed on a timeout."""
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def final_state(workdir, step: int) -> list[np.ndarray]:
    """The state's leaves at ``step`` as host arrays."""
    checkpoints = Checkpoints(os.path.join(workdir, "checkpoints"), read_only=True)
    try:
        state, _ = checkpoints.restore(None, step=step)
        return [np.asarray(x) for x in jax.tree.leaves(state)]
    finally:
        checkpoints.close()


def stored_positions(workdir, step: int) -> dict[str, bytes]:
    """Every data position stored at ``step``, by the share that read it ('index/count')."""
    from dew.checkpointing import layout

    checkpoints = Checkpoints(os.path.join(workdir, "checkpoints"), read_only=True)
    try:
        data = checkpoints.store.read_items(step, {layout.DATA_ITEM: None})[layout.DATA_ITEM]
    finally:
        checkpoints.close()
    out = {}
    for i, (index, count) in enumerate(zip(data["share_index"], data["share_count"], strict=True)):
        out[f"{index}/{count}"] = bytes(np.asarray(data["rows"])[i, : int(data["lengths"][i])].tobytes())
    return out


@pytest.mark.slow
def test_a_pair_trains_stops_together_on_sigterm_resumes_bit_exactly_and_resumes_on_one_process(tmp_path):
    cache = str(tmp_path / "cache")
    straight, interrupted, single = tmp_path / "straight", tmp_path / "interrupted", tmp_path / "single"
    t0 = time.monotonic()
    # Two pairs at once: one trains straight through, the other gets a SIGTERM at process 1 once
    # process 0's history shows a trained step (process 1 writes no history).
    reference = launch(straight, cache)
    pair = launch(interrupted, cache)
    wait_for(
        pair[0],
        lambda: any(r["category"] == "train" for r in complete_rows(interrupted)),
        "a train row of the interrupted pair",
    )
    pair[1].send_signal(signal.SIGTERM)
    stopped = finish(pair)
    ran = finish(reference)
    for i, (code, _, err) in enumerate(ran):
        assert code == 0, f"straight process {i}: {err[-3000:]}"
    # Both stop at one step with the preemption code; the checkpoint of that step is the one saved.
    steps = []
    for i, (code, out, err) in enumerate(stopped):
        assert code == PREEMPTED, f"interrupted process {i} exited {code}:\n{err[-3000:]}"
        said = [
            line
            for line in dew_stderr(subprocess.CompletedProcess([], code, out, err))
            if "preempted" in line
        ]
        assert len(said) == 1 and "preempted by SIGTERM at step " in said[0], err[-2000:]
        steps.append(int(said[0].split("at step ")[1].split(":")[0]))
    saved = steps[0]
    assert steps == [saved, saved] and 0 < saved < NUM_STEPS, steps
    landed = Checkpoints(str(interrupted / "checkpoints"), read_only=True)
    assert saved in landed.all_steps() and max(landed.all_steps()) == saved
    landed.close()
    # Each process stored its own share's position, and the two agree (global batches).
    positions = stored_positions(interrupted, saved)
    assert sorted(positions) == ["0/2", "1/2"] and positions["0/2"] == positions["1/2"], positions
    shutil.copytree(interrupted, single, ignore=shutil.ignore_patterns("cache"))

    # The pair relaunched, and the saved checkpoint on one process, at once; beside them a third
    # pair whose process 1 is killed outright once it trains: process 0 must stop with an error
    # (at the latest when the heartbeat times out), not wait for it.
    resumed, alone = launch(interrupted, cache), launch(single, cache, processes=1)
    doomed_dir = tmp_path / "doomed"
    heartbeat = 10
    doomed = launch(
        doomed_dir,
        cache,
        own=None,
        **{"train.num_steps": 10**6, "checkpoint.every": 0, "runtime.heartbeat_timeout": heartbeat},
    )
    wait_for(
        doomed[0],
        lambda: any(r["category"] == "train" for r in complete_rows(doomed_dir)),
        "a train row of the third pair",
    )
    doomed[1].kill()
    killed = time.monotonic()
    (survivor_code, _, survivor_err), _ = finish(doomed, timeout=heartbeat + 60)
    survived = time.monotonic() - killed
    survivor_lines = dew_stderr(subprocess.CompletedProcess([], survivor_code, "", survivor_err))
    assert survivor_code == 1 and survivor_lines[0].startswith("error: "), survivor_err[-2000:]
    assert survived < heartbeat + 30, survived  # the heartbeat bounds it; the rest is a loaded host
    done = finish(resumed) + finish(alone)
    for i, (code, out, err) in enumerate(done):
        assert code == 0, f"resumed process {i}: {err[-3000:]}"
        assert f"resuming from step {saved}" in out, out[-2000:]
    assert "number of processes changed from 2 to 1" in done[2][1], done[2][1][-2000:]

    # Process 0 alone writes the history: one row per category and logged step.
    history = [(r["category"], r["step"]) for r in rows(straight)]
    assert len(history) == len(set(history)) and ("train", NUM_STEPS) in history, history
    assert "process 1 of 2 (coordinator 127.0.0.1:" in ran[1][1], ran[1][1][-2000:]

    want, got = final_state(straight, NUM_STEPS), final_state(interrupted, NUM_STEPS)
    assert len(want) == len(got)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    # The history is the straight pair's, but for the one window the stop cut in two (its rows
    # after the resume average only the steps run since).
    every = MIXTURE["train.log_every"]

    def whole_windows(history: list[dict]) -> list[dict]:
        return [r for r in comparable(history) if r["step"] <= saved or r["step"] - every >= saved]

    assert whole_windows(rows(interrupted)) == whole_windows(rows(straight))
    # One process continued the same data stream: after the same number of global batches its
    # position is the pair's, and it trained to the end.
    assert stored_positions(single, NUM_STEPS) == {"0/1": stored_positions(straight, NUM_STEPS)["0/2"]}
    alone_state = final_state(single, NUM_STEPS)
    assert all(np.all(np.isfinite(x)) for x in alone_state if x.dtype.kind == "f")
    print(f"two-process CLI test: {time.monotonic() - t0:.1f} s")


def run_alone(
    workdir, *group: str, timeout: float = 120, **overrides
) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    result = subprocess.run(
        command(workdir, str(workdir) + "-cache", *group, **overrides),
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result, time.monotonic() - t0


def test_a_device_count_the_processes_do_not_divide_exits_2_before_waiting_for_peers(tmp_path):
    workdir = tmp_path / "run"
    port = free_port()
    group = (f"--coordinator=127.0.0.1:{port}", "--num_processes=2", "--process_id=0")
    result, _ = run_alone(workdir, *group, **{"mesh.devices": 3})
    lines = dew_stderr(result)
    assert result.returncode == 2, result.stderr[-2000:]
    assert lines == [
        "error: config.mesh.devices=3 is invalid with 2 processes: expected a multiple of 2 (each "
        "process gives the mesh an equal number of its devices), or 0 for every device"
    ], lines
    assert not workdir.exists()


def test_an_unreachable_coordinator_exits_2_within_its_timeout_naming_the_address(tmp_path):
    workdir = tmp_path / "run"
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    group = (f"--coordinator={address}", "--num_processes=2", "--process_id=1")
    result, seconds = run_alone(workdir, *group, **{"runtime.coordinator_timeout": 2})
    lines = dew_stderr(result)
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: the coordinator {address} (from flags) "), lines
    assert "cannot be reached within 2 s (config.runtime.coordinator_timeout)" in lines[0]
    # It waited the timeout, and not JAX's default of 300 s (start-up is the rest).
    assert 2 <= seconds < 2 + 60, seconds
    assert not workdir.exists()


def test_a_partial_process_group_exits_2_naming_what_is_missing(tmp_path):
    workdir = tmp_path / "run"
    result, _ = run_alone(workdir, "--coordinator=127.0.0.1:1234", "--num_processes=2")
    assert result.returncode == 2, result.stderr[-2000:]
    assert dew_stderr(result) == [
        "error: flags: --process_id missing: a multi-process run needs all of --coordinator, "
        "--num_processes, --process_id"
    ]
    assert not workdir.exists()


def test_processes_whose_configs_differ_all_exit_2_naming_the_first_differing_key(tmp_path):
    workdir = tmp_path / "run"
    own = [{}, {"optimizer.learning_rate": 0.003, "dataset.batch_size": 32}]
    results = finish(launch(workdir, str(tmp_path / "cache"), own=own), timeout=300)
    want = [
        "error: the processes of this run resolved different configs: config.dataset.batch_size is 16 in "
        "process 0 and 32 in process 1 of 2; start every process with the same config and overrides"
    ]
    for i, (code, out, err) in enumerate(results):
        lines = dew_stderr(subprocess.CompletedProcess([], code, out, err))
        assert (code, [x for x in lines if not x.startswith("[Gloo]")]) == (2, want), f"process {i}: {err}"
    assert not workdir.exists()


def test_process_0_started_alone_exits_2_with_one_line_within_the_coordinator_timeout(tmp_path):
    workdir = tmp_path / "run"
    address = f"127.0.0.1:{free_port()}"
    group = (f"--coordinator={address}", "--num_processes=2", "--process_id=0")
    result, seconds = run_alone(workdir, *group, **{"runtime.coordinator_timeout": 3})
    assert result.returncode == 2, result.stderr[-2000:]
    assert dew_stderr(result) == [
        "error: the process group did not form within 3 s (config.runtime.coordinator_timeout): process 0 "
        f"of 2 reached the coordinator {address} (from flags) and waited for the others to join; start "
        "all 2 processes with the same coordinator and process count"
    ], result.stderr[-3000:]
    assert 3 <= seconds < 3 + 60, seconds  # dew's deadline, not JAX's abort 30 s later
    assert not workdir.exists()


@pytest.mark.slow
def test_a_stopped_peer_stops_the_other_process_with_one_line_exit_1_and_a_traceback_file(tmp_path):
    """SIGSTOP to process 1 of one pair and to process 0 (the coordinator) of another: the process
    left running stops within the heartbeat timeout with dew's line, exit 1 and a traceback
    file (JAX's client would abort it with SIGABRT and a C++ stack)."""
    cache, heartbeat = str(tmp_path / "cache"), 10
    long_run = {"train.num_steps": 10**6, "checkpoint.every": 0, "runtime.heartbeat_timeout": heartbeat}
    pairs = {stopped: launch(tmp_path / f"stop{stopped}", cache, own=None, **long_run) for stopped in (1, 0)}
    try:
        for stopped, pair in pairs.items():
            wait_for(
                pair[0],
                lambda d=tmp_path / f"stop{stopped}": any(r["category"] == "train" for r in complete_rows(d)),
                f"a train row of the pair whose process {stopped} is stopped",
            )
        for stopped, pair in pairs.items():
            pair[stopped].send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        for stopped, pair in pairs.items():
            survivor = pair[1 - stopped]
            out, err = survivor.communicate(timeout=heartbeat + 60)
            waited = time.monotonic() - stopped_at
            lines = dew_stderr(subprocess.CompletedProcess([], survivor.returncode, out, err))
            assert survivor.returncode == 1, f"pair {stopped}: exit {survivor.returncode}\n{err[-3000:]}"
            who = f"process {stopped} of 2{'' if stopped else ' (the coordinator)'}"
            lost = f"error: {who} stopped answering: "
            assert len(lines) == 2 and lines[0].startswith(lost), lines
            assert "(config.runtime.heartbeat_timeout=10); it died, was stopped or hangs" in lines[0]
            logs = str(tmp_path / f"stop{stopped}" / "logs")
            assert lines[1].startswith(f"  full traceback: {logs}"), lines
            with open(lines[1].split(": ", 1)[1]) as f:
                text = f.read()
            assert "PeerLost" in text and "--- thread MainThread" in text, text[:2000]
            # The heartbeat bounds it, not JAX's + 30 s. The peer's last beat may precede the
            # SIGSTOP by one publishing interval (PeerWatch: heartbeat / 20), so the survivor can
            # call it lost that much before a full heartbeat has passed since the stop.
            assert heartbeat - heartbeat / 20 <= waited < heartbeat + 45, waited
    finally:
        for pair in pairs.values():
            for p in pair:
                if p.poll() is None:
                    p.kill()
                    p.communicate()


def test_process_0_refused_after_the_group_formed_stops_its_peer_in_one_line_and_neither_aborts(tmp_path):
    """Process 0 alone finds the workdir busy (exit 2) once the group is up: it marks that it
    leaves and waits for its peer to go, and the peer stops with dew's line (exit 1), instead of
    process 0 aborting in JAX's shutdown barrier."""
    import fcntl

    workdir = tmp_path / "run"
    workdir.mkdir()
    with open(workdir / "run.lock", "w") as held:  # another live run's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        results = finish(
            launch(workdir, str(tmp_path / "cache"), own=None, **{"runtime.heartbeat_timeout": 10}), 300
        )
    (code0, _, err0), (code1, _, err1) = results
    lines0, lines1 = (
        [x for x in dew_stderr(subprocess.CompletedProcess([], c, o, e)) if not x.startswith("warning: ")]
        for c, o, e in results
    )
    assert code0 == 2 and len(lines0) == 1 and "is in use by a running dew run" in lines0[0], err0[-3000:]
    assert code1 == 1 and lines1[0] == (
        "error: process 0 of 2 (the coordinator) left the run with exit status 2 (see its output), so this "
        "process stops too"
    ), err1[-3000:]
    assert len(lines1) == 2 and lines1[1].startswith("  full traceback: "), lines1
