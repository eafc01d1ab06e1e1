"""The FID protocol's progress file (``dew.scoring.fid_progress``) never yields a wrong FID: a
damaged or inconsistent file is refused in one line naming it (``read_progress``) and a draw sets
it aside in one line and draws again (never a stuck run), temporary files of killed draws are
removed at the next start, and an interrupted draw still resumes to the uninterrupted statistics
bit for bit (test_fid_protocol.py)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from test_fid_protocol import _draw, model  # noqa: F401  (the module fixture)

from dew.pinned_weights import content_sha256
from dew.scoring import fid_progress
from dew.scoring import fid_protocol as fp
from dew.scoring.fid_reference import FidInputError, MomentSums

SETTINGS = {"num_images": 11, "chunk": 5, "first_seed": 20, "detector": "proj"}
DIM = 6


def _written(outdir, chunks_done=2, count=10) -> dict[str, np.ndarray]:
    """A consistent progress file after 2 of 3 chunks, and its arrays."""
    sums = MomentSums()
    sums.add(np.random.default_rng(0).normal(size=(count, DIM)))
    fid_progress.write_progress(str(outdir), SETTINGS, chunks_done, sums)
    with np.load(outdir / fid_progress.PROGRESS_FILE) as data:
        return {k: data[k] for k in data.files}


def _rewrite(outdir, arrays: dict[str, np.ndarray], redigest: bool) -> None:
    """Write ``arrays`` as the progress file; ``redigest``: with a digest that matches them (an
    edit made with dew's own writer), else the old one (damage)."""
    arrays = dict(arrays)
    if redigest:
        body = {k: v for k, v in arrays.items() if k != "digest"}
        arrays["digest"] = np.asarray(content_sha256(body))
    with open(outdir / fid_progress.PROGRESS_FILE, "wb") as f:
        # allow_pickle: savez's default, named so that no array binds to it (the damage includes
        # object arrays)
        np.savez(f, allow_pickle=True, **arrays)


def test_a_consistent_file_reads_back_exactly(tmp_path):
    sums = MomentSums()
    sums.add(np.random.default_rng(1).normal(size=(10, DIM)))
    fid_progress.write_progress(str(tmp_path), SETTINGS, 2, sums)
    assert os.listdir(tmp_path) == [fid_progress.PROGRESS_FILE]
    chunks, back = fid_progress.read_progress(str(tmp_path), SETTINGS, DIM)
    assert chunks == 2 and back.count == 10
    np.testing.assert_array_equal(back.total, sums.total)
    np.testing.assert_array_equal(back.outer, sums.outer)
    assert fid_progress.read_progress(str(tmp_path / "none"), SETTINGS, DIM)[0] == 0


# (edit, re-digested?, what the refusal says). Re-digested edits pass the digest and must be
# caught by the consistency checks; the others are caught by the digest.
DAMAGE = [
    ("chunks_done", 3, True, "count=10 images after 3 chunks of 5, expected 11"),  # one up
    ("chunks_done", 1, True, "count=10 images after 1 chunks of 5, expected 5"),
    ("chunks_done", -1, True, r"chunks_done=-1, expected 1..3"),
    ("chunks_done", 0, True, r"chunks_done=0, expected 1..3"),
    ("chunks_done", 99, True, r"chunks_done=99, expected 1..3"),
    ("count", 9, True, "count=9 images after 2 chunks of 5, expected 10"),
    ("count", 11, True, "count=11 images after 2 chunks of 5, expected 10"),
    ("chunks_done", 3, False, "do not match the digest"),
    ("count", 9, False, "do not match the digest"),
    ("total", "nan", True, "its sums are not finite"),
    ("outer", "inf", True, "its sums are not finite"),
    ("total", "nan", False, "do not match the digest"),
    ("total", "short", True, r"member 'total' has shape \(5,\); expected float \[6\]"),
    ("outer", "flat", True, r"member 'outer' has shape \(36,\); expected float \[6, 6\]"),
    ("settings", "not json {", True, "its settings are not a JSON object"),
    ("settings", "[1, 2]", True, "its settings are not a JSON object"),
    ("settings", 7, True, r"member 'settings' is int64; expected text \[\]"),
    ("count", "object", False, r"member 'count' is object; expected int \[\]"),
    ("digest", None, False, r"lacking \['digest'\]"),  # a file of an older dew, or torn
    ("extra", 1, False, r"with unknown \['extra'\]"),
]


@pytest.mark.parametrize("name,value,redigest,message", DAMAGE)
def test_a_damaged_or_inconsistent_file_is_refused_in_one_line(tmp_path, name, value, redigest, message):
    arrays = _written(tmp_path)
    if value is None:
        del arrays[name]
    elif value == "object":
        arrays[name] = np.array([{"count": 10}], dtype=object)
    elif value in ("nan", "inf"):
        arrays[name] = arrays[name].copy()
        arrays[name].flat[3] = float(value)
    elif value == "short":
        arrays[name] = arrays[name][:-1]
    elif value == "flat":
        arrays[name] = arrays[name].reshape(-1)
    elif isinstance(value, str):
        arrays[name] = np.asarray(value)
    else:
        arrays[name] = np.asarray(value, np.int64)
    _rewrite(tmp_path, arrays, redigest)
    with pytest.raises(FidInputError, match=message) as refused:
        fid_progress.read_progress(str(tmp_path), SETTINGS, DIM)
    line = str(refused.value)
    assert "\n" not in line and str(tmp_path / fid_progress.PROGRESS_FILE) in line
    assert line.endswith("delete it to start over")


def test_not_an_npz_and_other_settings_are_refused(tmp_path):
    (tmp_path / fid_progress.PROGRESS_FILE).write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(FidInputError, match=r"is unusable: it is not an .npz archive.*delete it to start"):
        fid_progress.read_progress(str(tmp_path), SETTINGS, DIM)
    _written(tmp_path)
    with pytest.raises(FidInputError, match=r"other settings \(first_seed=20; now first_seed=21\)"):
        fid_progress.read_progress(str(tmp_path), {**SETTINGS, "first_seed": 21}, DIM)
    # the same file is consistent for a draw of 11 in chunks of 5 but not for 8 in chunks of 4
    with pytest.raises(FidInputError, match=r"other settings"):
        fid_progress.read_progress(str(tmp_path), {**SETTINGS, "num_images": 8, "chunk": 4}, DIM)


def test_a_complete_draw_reads_back_with_the_last_chunk_short(tmp_path):
    _written(tmp_path, chunks_done=3, count=11)
    assert fid_progress.read_progress(str(tmp_path), SETTINGS, DIM)[1].count == 11


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temporary_files_of_killed_draws_are_removed_at_the_next_start(model, tmp_path):  # noqa: F811
    """A SIGKILLed draw leaves ``fid-progress.npz.tmp-<pid>``: the next draw on that outdir
    removes it (and a stats temporary), leaves a live process's alone, and ends as a draw never
    interrupted."""
    whole = _draw(model, tmp_path / "whole", jax.devices()[:1]).run()
    cut = tmp_path / "cut"
    assert _draw(model, cut, jax.devices()[:1]).run(max_chunks=1) is None
    dead = _dead_pid()
    (cut / f"{fid_progress.PROGRESS_FILE}.tmp-{dead}").write_bytes(b"half a zip")
    (cut / f"{fp.STATS_FILE}.tmp-{dead}").write_bytes(b"half a zip")
    live = cut / f"{fid_progress.PROGRESS_FILE}.tmp-{os.getppid()}"  # a live process: kept
    live.write_bytes(b"")
    logs = []
    draw = _draw(model, cut, jax.devices()[:1])
    resumed = dataclasses.replace(draw, log=logs.append).run()
    assert whole is not None and resumed is not None
    assert sorted(os.listdir(cut)) == sorted([fid_progress.PROGRESS_FILE, live.name])
    assert any("removed 2 temporary files" in line for line in logs), logs
    np.testing.assert_array_equal(resumed.total, whole.total)
    np.testing.assert_array_equal(resumed.outer, whole.outer)


def test_a_damaged_file_is_set_aside_and_the_draw_redraws_the_same_sums(model, tmp_path, capsys):  # noqa: F811
    """Damage to the draw's own progress file never stops the run and never enters the sums: the
    draw sets the file aside with one line and draws every chunk again, to the same bits."""
    whole = _draw(model, tmp_path / "whole", jax.devices()[:1]).run()
    assert whole is not None
    cut = tmp_path / "cut"
    assert _draw(model, cut, jax.devices()[:1]).run(max_chunks=1) is None
    with np.load(cut / fid_progress.PROGRESS_FILE) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["chunks_done"] = np.asarray(2, np.int64)
    _rewrite(cut, arrays, redigest=True)
    damaged = (cut / fid_progress.PROGRESS_FILE).read_bytes()
    capsys.readouterr()
    redrawn = _draw(model, cut, jax.devices()[:1]).run()
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "count=5 images after 2 chunks of 5, expected 10" in line, line
    aside = [n for n in os.listdir(cut) if n.startswith(f"{fid_progress.PROGRESS_FILE}.damaged-")]
    assert len(aside) == 1 and (cut / aside[0]).read_bytes() == damaged and aside[0] in line
    assert redrawn is not None and redrawn.count == whole.count
    np.testing.assert_array_equal(redrawn.total, whole.total)
    np.testing.assert_array_equal(redrawn.outer, whole.outer)
