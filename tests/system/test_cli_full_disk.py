"""A disk that fills up under ``python -m dew.main``: one short error naming the cause, exit 1,
and nothing that was saved before is lost. The disk is a real size-limited tmpfs (the
checkpoint package's own tests inject the write failure where no tmpfs can be mounted). The runs
are the tiny 2D-mixture experiment's: what fills the disk is the run's own writing, whatever the
network."""

from __future__ import annotations

import json
import pathlib
import subprocess

import jax
import numpy as np
import pytest
from helpers_cli import cli as cli_on
from helpers_cli import dew_stderr, rows

from dew.checkpointing import Checkpoints


def cli(workdir, **overrides) -> subprocess.CompletedProcess:
    """``helpers_cli.cli`` on the tiny 2-D mixture run, with dotted config ``overrides``."""
    return cli_on(workdir, experiment="mixture", **overrides)


@pytest.fixture
def small_disk(tmp_path):
    def mount(size: str):
        target = tmp_path / f"disk{size}"
        target.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(target)
        return target

    mounted = []
    yield mount
    for target in mounted:  # lazily: a reader still holding a file would make a plain umount fail
        subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.fixture(scope="module")
def sizes(tmp_path_factory):
    """Disk bytes of one checkpoint of the tiny mixture config, and of everything else its run writes.
    Allocated blocks, not file sizes: a checkpoint is many small files, each taking whole blocks
    on the tmpfs (sizes undercount it several times over for a small model)."""
    probe = tmp_path_factory.mktemp("probe") / "run"
    assert cli(probe, **{"train.num_steps": 4}).returncode == 0

    def used(path: pathlib.Path) -> int:
        return path.stat().st_blocks * 512

    one = sum(used(f) for f in (probe / "checkpoints" / "4").rglob("*") if f.is_file())
    others = sum(used(f) for f in probe.rglob("*") if f.is_file() and "checkpoints" not in f.parts)
    return one, others


@pytest.mark.parametrize("room", ["one checkpoint", "no checkpoint"])
def test_a_full_disk_is_one_short_error_and_what_was_saved_stays_intact(sizes, small_disk, room):
    one, others = sizes
    # Room for the records and one checkpoint (plus half: orbax and tmpfs blocks need slack) or
    # for a quarter of one, never for two.
    fits = one * 3 // 2 if room == "one checkpoint" else one // 4
    workdir = small_disk(f"{(others + fits) // 1024 + 64}k") / "run"
    result = cli(workdir)
    lines = dew_stderr(result)
    assert result.returncode == 1, result.stderr
    assert lines[0].startswith("error: ") and len(lines) <= 3, lines
    assert "No space left on device" in "\n".join(lines)
    assert "Traceback" not in result.stderr
    checkpoints = Checkpoints(str(workdir / "checkpoints"))
    if room == "one checkpoint":
        assert checkpoints.latest == 4  # the step that fitted is intact and is what a resume reads
        state, _ = checkpoints.restore()
        leaves = jax.tree.leaves(state.params)
        assert int(state.step) == 4 and leaves and all(np.isfinite(np.asarray(x)).all() for x in leaves)
    else:
        assert checkpoints.latest is None  # no partial step passes for a checkpoint
    assert [r["step"] for r in rows(workdir) if r["category"] == "train"][:2] == [2, 4]
    assert json.loads((workdir / "run.json").read_text())["starts"][0]["resumed_from"] == 0
    # The traceback went where there was room (the workdir's disk may have none).
    traceback_file = lines[-1].split("full traceback: ")[-1]
    assert "Traceback" in pathlib.Path(traceback_file).read_text()
