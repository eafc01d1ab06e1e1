"""ADM's suite in the FID protocol, without a network (``dew.scoring.adm_progress``,
``dew.scoring.protocol_results``): a tally fed chunk by chunk, interrupted and resumed in a fresh
object, reports exactly what one never interrupted does; its numbers are the evaluator's rules on
every row; a damaged or inconsistent progress or chunk file is refused in one line naming it.

Features are random float32 rows of the detector's real width (2048 pool + 2023 spatial), the
Inception Score's classifier a random [1008, 2048] matrix; the network itself is tested in
test_inception_adm.py and the whole command in tests/system/test_fid_protocol_adm_cli.py."""

from __future__ import annotations

import io
import json
import os
import re

import numpy as np
import pytest

from dew.pinned_weights import content_sha256
from dew.scoring import adm_evaluator as adm
from dew.scoring import adm_progress as ap
from dew.scoring import protocol_results as results
from dew.scoring.adm_metrics import softmax
from dew.scoring.fid_progress import ProgressDamaged
from dew.scoring.fid_reference import FidInputError, MomentSums

NUM, CHUNK = 11, 4  # three chunks, the last one short (3 images)
SETTINGS = {"num_images": NUM, "chunk": CHUNK, "first_seed": 0, "detector": "adm"}
ROWS = ("is", "precision", "recall")  # the metrics from the chunk files (FID and sFID: the sums)
EPS64 = 2.0**-53


def _features(seed=0, n=NUM) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.abs(rng.normal(0.5, 1.0, (n, ap.DIM))).astype(np.float32)  # ReLU-like, as the taps


FEATURES = _features()
CLASSIFIER = np.random.default_rng(7).normal(0, 0.05, (1008, 2048)).astype(np.float32)


def probabilities(pool: np.ndarray) -> np.ndarray:
    return softmax(pool @ CLASSIFIER.T)


def _reference() -> dict[str, np.ndarray]:
    ref = _features(seed=3, n=9)
    pool, spatial = ref[:, :2048].astype(np.float64), ref[:, 2048:].astype(np.float64)
    return {
        "mu": pool.mean(0),
        "sigma": np.cov(pool, rowvar=False),
        "mu_s": spatial.mean(0),
        "sigma_s": np.cov(spatial, rowvar=False),
        "pool": ref[:, :2048],
    }


REFERENCE = _reference()


def _chunk(index: int) -> np.ndarray:
    return FEATURES[index * CHUNK : (index + 1) * CHUNK]


def _draw(outdir, chunks: range, tally: ap.AdmTally | None = None) -> ap.AdmTally:
    """What ``Draw.run_tally`` does with a tally on process 0: resume, then add and commit."""
    os.makedirs(outdir, exist_ok=True)
    tally = tally or ap.AdmTally(NUM, CHUNK)
    done = tally.resume(str(outdir), SETTINGS)
    assert done == chunks.start
    for index in chunks:
        tally.add(index, _chunk(index))
        tally.commit(str(outdir), SETTINGS, index + 1)
    return tally


def _scores(tally, outdir) -> dict[str, float]:
    """The metrics read from the chunk files; FID and sFID are ``frechet_distance`` of
    ``tally.statistics()`` (tests/test_adm_evaluator.py), compared here through the statistics:
    a 2048-d Fréchet distance costs tens of seconds on this CPU."""
    return results.scores(ROWS, tally, str(outdir), REFERENCE, probabilities)


def _same_statistics(a: ap.AdmTally, b: ap.AdmTally) -> bool:
    sa, sb = a.statistics(), b.statistics()
    return set(sa) == set(sb) == {"mu", "sigma", "mu_s", "sigma_s"} and all(
        np.array_equal(sa[k], sb[k]) for k in sa
    )


def test_an_interrupted_tally_resumed_reports_the_uninterrupted_numbers(tmp_path):
    whole = _draw(tmp_path / "whole", range(3))
    _draw(tmp_path / "cut", range(1))
    assert sorted(os.listdir(tmp_path / "cut")) == sorted([ap.PROGRESS_FILE, ap.chunk_file(0)])
    resumed = _draw(tmp_path / "cut", range(1, 3))  # a fresh tally: a new process's view
    assert resumed.count == whole.count == NUM
    for a, b in ((whole.pool_sums, resumed.pool_sums), (whole.spatial_sums, resumed.spatial_sums)):
        np.testing.assert_array_equal(a.total, b.total)
        np.testing.assert_array_equal(a.outer, b.outer)
    assert resumed.digests == whole.digests
    assert _same_statistics(resumed, whole)  # FID and sFID: functions of these alone
    got, want = _scores(resumed, tmp_path / "cut"), _scores(whole, tmp_path / "whole")
    assert got == want and list(got) == list(ROWS)  # bit for bit, in the order asked
    for index in range(3):  # the chunk files byte for byte (an .npz records its write time)
        name = ap.chunk_file(index)
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes(), name
    a, b = _progress(tmp_path / "whole"), _progress(tmp_path / "cut")
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_numbers_are_the_evaluators_rules_on_every_row(tmp_path):
    """Precision, recall and the Inception Score from the chunk files equal the evaluator's
    functions on all rows at once (the same float32 rows, the same per-chunk softmax: exact).
    The statistics FID and sFID take: the float64 chunk sums against ``np.mean``/``np.cov`` of
    all rows differ only by summation order and the sums' cancellation (Σ = (Σffᵀ − nμμᵀ)/(n−1)):
    per entry |δμ| ≤ 2·N·ε₆₄·max|f| and |δΣ| ≤ 4·(N + 1)·ε₆₄·max|f|² (N = 11 rows, each side's
    error counted)."""
    tally = _draw(tmp_path, range(3))
    got = results.scores(("recall", "is", "precision"), tally, str(tmp_path), REFERENCE, probabilities)
    assert list(got) == ["recall", "is", "precision"]
    pool = FEATURES[:, :2048]
    precision, recall = adm.precision_recall(REFERENCE["pool"], pool)
    assert (got["precision"], got["recall"]) == (precision, recall)
    probs = np.concatenate([probabilities(_chunk(i)[:, :2048]) for i in range(3)])
    assert got["is"] == adm.inception_score(probs)
    stats = tally.statistics()
    for part, mu, sigma in ((pool, "mu", "sigma"), (FEATURES[:, 2048:], "mu_s", "sigma_s")):
        rows = part.astype(np.float64)
        big = np.abs(rows).max()
        np.testing.assert_allclose(stats[mu], rows.mean(0), rtol=0, atol=2 * NUM * EPS64 * big)
        np.testing.assert_allclose(
            stats[sigma], np.cov(rows, rowvar=False), rtol=0, atol=4 * (NUM + 1) * EPS64 * big**2
        )


def test_results_read_back_as_a_reference_batch_and_the_report_names_its_inputs(tmp_path):
    import dataclasses

    tally = _draw(tmp_path, range(3))
    scores = _scores(tally, tmp_path)

    @dataclasses.dataclass
    class Sampler:
        def settings(self):
            return {"preset": "cifar10"}

    @dataclasses.dataclass
    class Detector:
        description: str = "adm detector"

    @dataclasses.dataclass
    class Draw:
        num: int = NUM
        first_seed: int = 5
        sampler: Sampler = dataclasses.field(default_factory=Sampler)
        identity: dict = dataclasses.field(default_factory=lambda: {"step": 2})
        detector: Detector = dataclasses.field(default_factory=Detector)

    ref = {"resolution": (8, 8), "num_images": np.int64(9), "detector": "x", "mu": np.zeros(2)}
    report = results.report(scores, Draw(), ref, "ref.npz", "ab" * 32)
    assert list(report)[:3] == list(ROWS) and report["seeds"] == [5, 15]
    assert report["reference"] == {
        "path": os.path.abspath("ref.npz"),
        "sha256": "ab" * 32,
        "resolution": [8, 8],
        "num_images": 9,
        "detector": "x",
    }
    results.write_results(str(tmp_path), tally, report, (8, 8))
    assert json.loads((tmp_path / ap.REPORT_FILE).read_text()) == report
    back = adm.read_reference_batch(str(tmp_path / ap.STATS_FILE))
    assert back["resolution"] == (8, 8) and back["num_images"] == NUM
    for k, v in tally.statistics().items():
        np.testing.assert_array_equal(back[k], v)


def _progress(outdir) -> dict[str, np.ndarray]:
    with np.load(outdir / ap.PROGRESS_FILE) as data:
        return {k: data[k] for k in data.files}


def _rewrite(outdir, arrays, redigest: bool) -> None:
    arrays = dict(arrays)
    if redigest:
        arrays["digest"] = np.asarray(content_sha256({k: v for k, v in arrays.items() if k != "digest"}))
    with open(outdir / ap.PROGRESS_FILE, "wb") as f:
        np.savez(f, **arrays)


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 1
    path.write_bytes(bytes(data))


# (what is done to a draw of 2 chunks done, what the refusal says)
def _damages():
    c1 = ap.chunk_file(1)
    short = _npy(np.zeros((3, 2048), np.float32))
    wide = _npy(np.zeros((4, 2023), np.float32))
    f64 = _npy(np.zeros((4, 2048), np.float64))
    nan = _npy(np.full((4, 2048), np.nan, np.float32))
    pickled = _npy(np.array([{"rows": 4}], dtype=object))

    def replace_recorded(data: bytes):
        """A chunk file replaced and its digest re-recorded as dew's own writer would: the
        digest holds, the contents are checked."""

        def edit(outdir):
            (outdir / c1).write_bytes(data)
            arrays = _progress(outdir)
            arrays["pool_sha256"] = np.asarray([str(arrays["pool_sha256"][0]), _sha(data)])
            _rewrite(outdir, arrays, redigest=True)

        return edit

    def progress_edit(name, value, redigest=True):
        def edit(outdir):
            arrays = _progress(outdir)
            arrays[name] = value(arrays[name])
            _rewrite(outdir, arrays, redigest)

        return edit

    def nan_at(a):
        a = a.copy()
        a.flat[7] = np.nan
        return a

    def torn_progress(outdir):  # a byte of the progress file's last member: its CRC-32 fails
        data = bytearray((outdir / ap.PROGRESS_FILE).read_bytes())
        data[data.index(b"PK\x01\x02") - 1] ^= 1
        (outdir / ap.PROGRESS_FILE).write_bytes(bytes(data))

    return [
        (torn_progress, r"member '\w+' cannot be read \(BadZipFile: Bad CRC-32"),
        (lambda o: _flip_a_byte(o / c1), rf"its chunk file \S*{c1} does not match the digest recorded"),
        (lambda o: os.remove(o / c1), rf"its chunk file \S*{c1} cannot be read \(FileNotFoundError\)"),
        (lambda o: (o / c1).write_bytes(_npy(np.ones((4, 2048), np.float32))), "does not match the digest"),
        (replace_recorded(short), r"has shape \(3, 2048\); expected float \[4, 2048\]"),
        (replace_recorded(wide), r"has shape \(4, 2023\); expected float \[4, 2048\]"),
        (replace_recorded(f64), r"holds more bytes than float32 \(4, 2048\) rows"),
        (replace_recorded(nan), "holds values that are not finite"),
        (replace_recorded(pickled), r"adm-pool-00001.npy is object; expected float \[4, 2048\]"),
        (replace_recorded(b"not an npy"), r"is not a .npy array"),
        (
            progress_edit("pool_sha256", lambda a: a[:1]),
            r"pool_sha256 holds \(1,\) digests, expected one per",
        ),
        (progress_edit("pool_sha256", lambda a: a[::-1]), "does not match the digest recorded"),
        (
            progress_edit("pool_sha256", lambda a: a[::-1], redigest=False),
            "its arrays do not match the digest",
        ),
        (progress_edit("total_s", nan_at), "its spatial sums are not finite"),
        (progress_edit("outer_s", nan_at, redigest=False), "its arrays do not match the digest"),
        (progress_edit("outer_s", lambda a: a[:-1]), r"member 'outer_s' has shape \(2022, 2023\)"),
        (progress_edit("total_s", lambda a: a.astype(np.float32)[:5]), r"member 'total_s' has shape \(5,\)"),
        (progress_edit("pool_sha256", lambda a: np.asarray(3)), r"member 'pool_sha256' is int64"),
        (progress_edit("chunks_done", lambda a: np.asarray(3, np.int64)), "count=8 images after 3 chunks"),
    ]


@pytest.mark.parametrize("damage,message", _damages())
def test_a_damaged_progress_or_chunk_file_is_refused_in_one_line(tmp_path, damage, message):
    _draw(tmp_path, range(2))
    damage(tmp_path)
    with pytest.raises(ProgressDamaged, match=message) as refused:
        ap.AdmTally(NUM, CHUNK).read(str(tmp_path), SETTINGS)
    line = str(refused.value)
    assert "\n" not in line and str(tmp_path / ap.PROGRESS_FILE) in line, line
    assert line.startswith(f"--outdir={str(tmp_path)!r}: the ADM progress file")
    assert line.endswith("delete it to start over")


@pytest.mark.parametrize("damage,message", _damages()[:3])
def test_a_draw_sets_a_damaged_progress_aside_and_starts_over(tmp_path, capsys, damage, message):
    """Damage dew's own files could suffer is not a stuck run: the draw's ``resume`` renames the
    progress file aside, says so in one line, and the draw starts from chunk 0."""
    _draw(tmp_path, range(2))
    damage(tmp_path)
    tally = ap.AdmTally(NUM, CHUNK)
    assert tally.resume(str(tmp_path), SETTINGS) == 0 and tally.count == 0 and tally.digests == []
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and re.search(message, line) and "set it aside as" in line, line
    assert not (tmp_path / ap.PROGRESS_FILE).exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(f"{ap.PROGRESS_FILE}.damaged-")]
    redrawn = _draw(tmp_path, range(3))  # chunk 0 onward, its files rewritten
    assert _same_statistics(redrawn, _draw(tmp_path / "whole", range(3)))


def test_a_chunk_file_damaged_after_the_draw_stops_the_report(tmp_path):
    """The report reads every chunk file again against its digest: one changed after the last
    chunk (or between the resume check and the report) is refused, never scored."""
    tally = _draw(tmp_path, range(3))
    _flip_a_byte(tmp_path / ap.chunk_file(2))
    with pytest.raises(FidInputError, match=r"adm-pool-00002.npy does not match the digest.*start over$"):
        _scores(tally, tmp_path)
    assert tally.statistics()["sigma_s"].shape == (2023, 2023)  # FID and sFID need no chunk file


def test_a_chunk_file_left_past_the_progress_is_rewritten_and_other_settings_refused(tmp_path):
    """A draw killed after writing chunk 1's file but before its progress: the rerun draws chunk
    1 again over it and ends as an uninterrupted draw."""
    whole = _draw(tmp_path / "whole", range(3))
    cut = tmp_path / "cut"
    _draw(cut, range(1))
    (cut / ap.chunk_file(1)).write_bytes(b"half a chunk")
    resumed = _draw(cut, range(1, 3))
    assert _same_statistics(resumed, whole)
    assert _scores(resumed, cut) == _scores(whole, tmp_path / "whole")
    with pytest.raises(
        FidInputError, match=r"other settings \(first_seed=0; now first_seed=1\).*adm-progress"
    ):
        ap.AdmTally(NUM, CHUNK).resume(str(cut), {**SETTINGS, "first_seed": 1})
    with pytest.raises(FidInputError, match=r"2 of 3 chunks drawn"):
        _scores(_draw(tmp_path / "two", range(2)), tmp_path / "two")


def test_the_fid_progress_file_is_unchanged_by_the_extra_arrays(tmp_path):
    """The FID protocol's file holds exactly its own arrays (no ADM ones), and ADM's cannot be
    read as FID's: each protocol keeps its own file."""
    from dew.scoring import fid_progress

    sums = MomentSums()
    sums.add(FEATURES[:4, :6])
    fid_progress.write_progress(str(tmp_path), {**SETTINGS, "detector": "proj"}, 1, sums)
    assert set(np.load(tmp_path / fid_progress.PROGRESS_FILE).files) == {
        "settings",
        "chunks_done",
        "count",
        "total",
        "outer",
        "digest",
    }
    _draw(tmp_path, range(1))
    assert set(_progress(tmp_path)) == {
        "settings",
        "chunks_done",
        "count",
        "total",
        "outer",
        "digest",
        "total_s",
        "outer_s",
        "pool_sha256",
    }
    with pytest.raises(ValueError, match=r"extra arrays \['count'\] would replace"):
        fid_progress.write_progress(str(tmp_path), SETTINGS, 1, sums, extra={"count": np.asarray(1)})


def test_precision_and_recall_ask_the_references_rows(tmp_path):
    """``adm_metrics.needs_rows``: precision or recall (not FID, sFID, IS) need the reference's
    pool rows, so ``reference_batch`` refuses statistics alone or fewer rows than a point and its
    k nearest neighbours for them, and ``embed_reference`` returns the stored rows with them."""
    from dew.scoring.adm_metrics import embed_reference, needs_rows, reference_batch

    assert [needs_rows(m) for m in (("fid", "sfid", "is"), ("precision",), ("fid", "recall"))] == [
        False,
        True,
        True,
    ]
    stats = {
        "mu": np.zeros(adm.POOL_DIM),
        "sigma": np.eye(adm.POOL_DIM),
        "mu_s": np.zeros(adm.SPATIAL_DIM),
        "sigma_s": np.eye(adm.SPATIAL_DIM),
    }
    k = max(adm.NHOOD_SIZES)
    few = str(tmp_path / "few.npz")  # k rows: each point's k nearest neighbours need k + 1
    pool = FEATURES[:k, : adm.POOL_DIM]
    adm.write_reference_batch(few, images=None, pool=pool, stats=stats, resolution=(8, 8), detector="d")
    stats_only = str(tmp_path / "stats_only.npz")
    np.savez(stats_only, **stats)
    assert reference_batch(few, ("fid", "sfid"))["num_images"] == k
    assert reference_batch(stats_only, ("fid", "is"))["mu"].shape == (adm.POOL_DIM,)
    with pytest.raises(adm.ReferenceBatchError, match=rf"holds {k} images; precision and recall need"):
        reference_batch(few, ("fid", "precision"))
    with pytest.raises(adm.ReferenceBatchError, match="holds statistics only; precision and recall"):
        reference_batch(stats_only, ("recall",))
    reference = {**stats, "pool": pool}
    for metrics in (("fid",), ("precision", "recall")):  # no scorer: nothing is embedded
        embedded = embed_reference(reference, None, metrics, batch=2)  # pyright: ignore[reportArgumentType]
        assert set(embedded) == {*stats, "pool"} and embedded["pool"] is pool


def test_the_suite_embeds_a_sources_images_in_the_scorers_batches():
    """A run's draws come in batches smaller than ``--batch_size``: ADM's suite regroups them, so
    the scorer pads at most the last batch, and the statistics are those of every image once."""
    from dew.scoring.adm_metrics import evaluate

    class Rows:  # the scorer's interface: pool and spatial rows of uint8 images, a batch at a time
        batch = 4

        def __init__(self):
            self.calls: list[int] = []

        def features(self, images):
            self.calls.append(len(images))
            x = images.reshape(len(images), -1).astype(np.float32)
            return x[:, :5], x[:, 5:8]

    images = np.random.default_rng(0).uniform(0, 1, (11, 2, 2, 3)).astype(np.float32)
    draws = [images[i : i + 3] for i in range(0, 11, 3)]  # 3, 3, 3, 2 images
    scorer = Rows()
    features, scores = evaluate(("fid",), iter(draws), (0.0, 1.0), None, scorer, batch=4)  # type: ignore[arg-type]
    assert scorer.calls == [4, 4, 3] and scores == {}
    pixels = np.rint(images * 255).reshape(11, -1)[:, :5]  # [0, 1] rounded back to the 8-bit pixels
    np.testing.assert_array_equal(features.pool, pixels)
    pool = pixels.astype(np.float64)
    # float64 moments of 11 rows of values below 256, merged over 3 batches: the error of each
    # entry stays below (11 + 3 * 3) * eps relative to 256**2; 64 * eps * 256**2 bounds it
    atol = 64 * np.finfo(np.float64).eps * 256**2
    np.testing.assert_allclose(features.statistics()["mu"], pool.mean(0), rtol=0, atol=atol)
    np.testing.assert_allclose(features.statistics()["sigma"], np.cov(pool, rowvar=False), rtol=0, atol=atol)
