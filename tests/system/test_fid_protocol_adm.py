"""ADM's suite in the protocol's draw (``Draw.run_tally`` with ``dew.scoring.adm_progress.AdmTally``):
sharded over 8 devices it tallies what 1 device does, interrupted and resumed on other devices it
ends on the uninterrupted sums, digests and chunk files, and a killed draw's temporary chunk file
is removed at the next start.

The model is test_fid_protocol's tiny MLP; the detector an integer projection of the uint8 pixels
to the suite's 2048 + 2023 columns (exact in float32 and float64 in any order), so everything
compares bit for bit and the test measures the protocol, not the Inception network."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from test_fid_progress import _dead_pid
from test_fid_protocol import FEW_STEPS, model  # noqa: F401  (the module fixture)

from dew.scoring import adm_progress as ap
from dew.scoring import fid_protocol as fp
from dew.scoring.fid_detector import Detector

NUM, CHUNK = 11, 5


def projection() -> Detector:
    matrix = np.random.default_rng(5).integers(-2, 3, (8 * 8 * 3, ap.DIM)).astype(np.float32)
    return Detector(
        lambda m, x: x.reshape(x.shape[0], -1).astype(jnp.float32) @ m, jnp.asarray(matrix), ap.DIM, "proj"
    )


def _run(model, outdir, devices, logs=None, **kw) -> tuple[bool, ap.AdmTally]:  # noqa: F811
    objective, params = model
    draw = fp.Draw(
        objective,
        params,
        FEW_STEPS["cifar10"],
        projection(),
        num=NUM,
        first_seed=20,
        batch=2,
        chunk=CHUNK,
        outdir=str(outdir),
        devices=devices,
        log=(logs.append if logs is not None else lambda line: None),
    )
    tally = ap.AdmTally(NUM, CHUNK)
    return draw.run_tally(tally, **kw), tally


def _direct(model) -> np.ndarray:  # noqa: F811
    objective, params = model
    images = np.asarray(
        jax.jit(lambda p, s: fp.draw_images(objective, p, s, FEW_STEPS["cifar10"]))(
            params, jnp.arange(20, 20 + NUM, dtype=jnp.int32)
        )
    )
    rgb = np.repeat(images, 3, axis=-1).reshape(NUM, -1).astype(np.float32)
    return rgb @ np.asarray(projection().params)


def _same(a: ap.AdmTally, b: ap.AdmTally) -> None:
    assert a.count == b.count == NUM and a.digests == b.digests and len(a.digests) == 3
    for x, y in ((a.pool_sums, b.pool_sums), (a.spatial_sums, b.spatial_sums)):
        np.testing.assert_array_equal(x.total, y.total)
        np.testing.assert_array_equal(x.outer, y.outer)


def test_sharded_interrupted_and_resumed_draws_tally_the_uninterrupted_suite(model, tmp_path):  # noqa: F811
    assert jax.device_count() >= 8
    complete, eight = _run(model, tmp_path / "eight", jax.devices()[:8])
    assert complete
    _, one = _run(model, tmp_path / "one", jax.devices()[:1])
    _same(eight, one)
    # the rows are the seeds' own features, pool first, spatial after
    direct = _direct(model)
    rows = np.concatenate(eight.pool_rows(str(tmp_path / "eight")))
    np.testing.assert_array_equal(rows, direct[:, :2048])
    np.testing.assert_array_equal(eight.spatial_sums.total, direct[:, 2048:].astype(np.float64).sum(0))

    cut = tmp_path / "cut"
    complete, _ = _run(model, cut, jax.devices()[:2], max_chunks=1)
    assert not complete
    assert sorted(os.listdir(cut)) == sorted([ap.PROGRESS_FILE, ap.chunk_file(0)])
    dead = _dead_pid()
    (cut / f"{ap.chunk_file(1)}.tmp-{dead}").write_bytes(b"half a chunk")  # killed while writing
    logs: list[str] = []
    complete, resumed = _run(model, cut, jax.devices()[4:8], logs)
    assert complete
    assert any("resuming after 1/3 chunks (5/11 images)" in line for line in logs), logs
    assert any("removed 1 temporary files" in line for line in logs), logs
    _same(resumed, eight)
    assert sorted(os.listdir(cut)) == sorted(os.listdir(tmp_path / "eight"))
    for i in range(3):
        name = ap.chunk_file(i)
        assert (cut / name).read_bytes() == (tmp_path / "eight" / name).read_bytes()
    # a complete draw rerun draws nothing and holds the same tally
    complete, again = _run(model, cut, jax.devices()[:1])
    assert complete
    _same(again, eight)
