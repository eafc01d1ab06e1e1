"""What a save costs the loop, and what it leaves on disk: a save returns without waiting for the
write unless the previous one is still in flight; pruned steps are removed off the writer's path;
every way of writing restores; a checkpoint written by 729b5ab's code (``data/checkpoint_729b5ab``,
OCDBT items, a raw key) restores whole: state, EMA, data position, metrics, checksums."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import threading
import time

import jax
import numpy as np
import pytest

from dew.checkpointing import Checkpoints
from dew.data.dataset import DataPartition

sys.path.insert(0, str(pathlib.Path(__file__).parent / "data"))
from make_checkpoint_729b5ab import tiny_state

OLD_CHECKPOINT = pathlib.Path(__file__).parent / "data" / "checkpoint_729b5ab"


def same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def test_a_checkpoint_written_by_729b5abs_code_restores_whole(tmp_path):
    shutil.copytree(OLD_CHECKPOINT, tmp_path / "old")
    c = Checkpoints(str(tmp_path / "old"), read_only=True)
    assert c.all_steps() == [3] and c.metrics(3) == {"loss": 0.25}
    c.verify(3)  # its checksums, as written
    fresh = tiny_state(0)
    state, position = c.resume(fresh, share=DataPartition(0, 1))
    assert same(state.replace(ema_law=None), tiny_state(3)) and state.ema_law is not None
    assert position is not None and json.loads(position) == {"epoch": 0, "batch": 3}
    # its law is in extra: restore_ema needs no argument
    float32_rounding = 8 * 2**-24 / (1 - 0.9**3)  # 3 roundings in 0.9**3 and a few in the division
    np.testing.assert_allclose(
        c.restore_ema(None)["w"], 0.25 * tiny_state(3).params["w"] / (1 - 0.9**3), rtol=float32_rounding
    )
    # and a run goes on from it in its own directory, in today's format
    target = Checkpoints(str(tmp_path / "new"), asynchronous=False)
    target.save(4, state.replace(step=state.step + 1), position, share=DataPartition(0, 1))
    again, _ = Checkpoints(str(tmp_path / "new"), read_only=True).resume(fresh)
    assert same(again.params, state.params) and int(again.step) == 4


@pytest.mark.parametrize("ocdbt", [True, False, None])
def test_every_way_of_writing_writes_and_restores(tmp_path, ocdbt):
    c = Checkpoints(str(tmp_path / "c"), asynchronous=False, ocdbt=ocdbt)
    c.save(2, tiny_state(2), None)
    c.verify(2)
    # orbax with / without OCDBT; None: a small state written directly, without (direct_write)
    assert (tmp_path / "c" / "2" / "params" / "manifest.ocdbt").exists() == bool(ocdbt)
    state, _ = Checkpoints(str(tmp_path / "c"), read_only=True).resume(tiny_state(0))
    assert same(state, tiny_state(2))


def test_a_save_returns_before_its_write_lands_and_waits_only_for_one_still_in_flight(tmp_path, monkeypatch):
    c = Checkpoints(str(tmp_path / "c"), keep=None)
    release, started = threading.Event(), threading.Event()
    write = c.store.write

    def held_write(*args, **kwargs):
        started.set()
        assert release.wait(60)
        write(*args, **kwargs)

    monkeypatch.setattr(c.store, "write", held_write)
    c.save(1, tiny_state(1), None)  # returns at once: the write is held back on the writer thread
    assert started.wait(60) and c.writer.busy
    done = threading.Event()

    def second_save():
        c.save(2, tiny_state(2), None)  # the first is still in flight: this one waits for it
        done.set()

    thread = threading.Thread(target=second_save)
    thread.start()
    time.sleep(0.5)
    assert not done.is_set()
    release.set()
    thread.join(60)
    assert done.is_set()
    c.wait()
    assert c.all_steps() == [1, 2]


def test_pruned_steps_are_removed_off_the_writers_path_and_gone_after_wait(tmp_path, monkeypatch):
    c = Checkpoints(str(tmp_path / "c"), keep=1, keep_best=False, asynchronous=False)
    removing, release = threading.Event(), threading.Event()
    rmtree = type(c.store.directory).rmtree

    def slow_rmtree(path, *args, **kwargs):
        removing.set()
        assert release.wait(60)
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(type(c.store.directory), "rmtree", slow_rmtree)
    c.save(1, tiny_state(1), None)
    c.save(2, tiny_state(2), None)  # prunes step 1: returned while its files are being removed
    assert removing.wait(60) and c.all_steps() == [2]
    assert [p.name.startswith(".deleting-1-") for p in (tmp_path / "c").iterdir() if p.name != "2"] == [True]
    release.set()
    c.wait()
    assert sorted(os.listdir(tmp_path / "c")) == ["2"]
    c.close()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are Linux's")
@pytest.mark.parametrize("ocdbt", [True, None])
def test_a_write_through_orbax_runs_at_a_lower_priority_than_the_loop_and_a_direct_one_does_not(
    tmp_path, ocdbt
):
    from dew.checkpointing.writer import WRITER_NICENESS, yield_to_the_loop

    def priority() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    here = priority()
    c = Checkpoints(str(tmp_path / "c"), keep=1, keep_best=False, ocdbt=ocdbt)
    c.save(1, tiny_state(1), None)
    c.save(2, tiny_state(2), None)  # prunes step 1: the remover's thread starts
    c.wait()
    seen = []
    c.writer.submit(lambda: seen.append(priority()))  # the writer's one thread, after its writes
    c.wait()
    remover = c.store._remover
    assert remover is not None
    seen.append(remover.submit(priority).result())
    c.close()
    lowered = min(here + WRITER_NICENESS, 19)
    # orbax's write (much of it off the GIL) yields the cores; a small direct one (mostly Python,
    # holding the GIL) stays at the loop's priority, and so does its remover
    assert WRITER_NICENESS > 0 and seen == ([lowered, lowered] if ocdbt else [here, here])
    yield_to_the_loop()  # on the loop's own thread (a synchronous save): nothing
    assert priority() == here


def test_the_writer_names_the_writes_still_pending_until_they_finish():
    from dew.checkpointing.writer import Writer

    release = threading.Event()
    writer = Writer(asynchronous=True)

    def held_write() -> None:
        release.wait()

    writer.submit(held_write, label=8)
    assert writer.pending == [8]  # queued or running: a second Ctrl-C names it
    release.set()
    writer.wait()
    assert writer.pending == []
    writer.submit(lambda: None, label=9)
    writer.abandon()
    assert writer.pending == []
    writer.close()
