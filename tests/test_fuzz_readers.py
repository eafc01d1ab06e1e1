"""The fuzz tier of dew's readers: real files dew writes or reads (a FID reference, an ADM
reference batch, a FID progress file, a DiT ``.pt`` zip, a converter ``.npz``), mutated as damage
and hostile edits do (a flipped byte, a truncation, a member re-headered with another dtype and
shape, a member inflated by a deflate stream), then read.

The property, for every mutation: the read succeeds with results identical to the unmutated
file's, or fails with the reader's one-line error naming the file (the CLIs print it and exit 2),
or (a progress file) the draw sets the file aside in one line and starts over. The only other
success allowed is a re-header declaring exactly the bytes the member holds with a dtype the
reader accepts: another valid file, which no reader can tell apart without a digest (the progress
file's digest does). And the read's peak of traced memory stays under

    FACTOR · (the bytes the unmutated file holds) + SLACK,

``FACTOR`` = 2 (each array once, plus one converted copy: float32 for a checkpoint, float64 for
sums) and ``SLACK`` = 4 MiB (``dew.bounded_zip``'s 1 MiB read pieces, ``zipfile``'s own buffers
and directory, Python objects); a ``.pt`` reader's bound is its own (``Bounds.array_bytes``:
8 × the file + 1 MiB) plus ``SLACK``. A declaration is never trusted: a re-header asking for
298 GiB, or an entry inflating 16 MiB past what it should hold, stays under the bound.

``EXAMPLES`` = 40 mutations per reader, ``derandomize=True`` (the same cases on every run), no
deadline: about a second per reader on one CPU core. ``DEW_FUZZ_EXAMPLES=2000`` searches longer,
with new cases each run.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import shutil
import tempfile
import tracemalloc
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dew.interop import torch_zip
from dew.interop.dit_checkpoint import CheckpointError, read_checkpoint
from dew.interop.pickle_bounds import Bounds, PickleRefused
from dew.scoring import adm_evaluator as adm
from dew.scoring import fid_progress
from dew.scoring.fid_reference import FidInputError, MomentSums, load_reference, save_reference

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIT = ROOT / "third_party" / "dit"
EXAMPLES = int(os.environ.get("DEW_FUZZ_EXAMPLES", "40"))  # set: a longer search, new cases each run
FACTOR, SLACK = 2, 4 << 20
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="DEW_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DTYPES = ["<f8", "<f4", ">f8", "<i8", "|u1", "|b1", "<U8", "|O", "|V8", "<c16", "<f16"]


# --------------------------------------------------------------------------------- mutations


@dataclasses.dataclass(frozen=True)
class Mutation:
    """What was done to the file; ``same_bytes``: a re-header declaring the member's own byte
    count (the result may be another valid file)."""

    kind: str
    apply: Callable[[bytes], bytes]
    same_bytes: bool = False


def _entries(data: bytes) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info, archive.read(info)) for info in archive.infolist()]


def _rezip(entries: list[tuple[str, bytes, int]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, content, compression in entries:
            archive.writestr(zipfile.ZipInfo(name), content, compress_type=compression)
    return out.getvalue()


def _npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _npy_data(content: bytes) -> bytes:
    f = io.BytesIO(content)
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    read(f)
    return content[f.tell() :]


@st.composite
def mutations(draw: Any, original: bytes, npy_members: bool) -> Mutation:
    """One mutation of ``original`` (a zip): a flip, a truncation, an inflated entry and, for an
    archive of ``.npy`` members, a re-header."""
    kinds = ["flip", "truncate", "inflate", *(["reheader"] if npy_members else [])]
    kind = draw(st.sampled_from(kinds))
    if kind == "flip":
        at, xor = draw(st.integers(0, len(original) - 1)), draw(st.integers(1, 255))

        def flip(data: bytes) -> bytes:
            out = bytearray(data)
            out[at] ^= xor
            return bytes(out)

        return Mutation(f"flip byte {at} ^ {xor}", flip)
    if kind == "truncate":
        end = draw(st.integers(0, len(original) - 1))
        return Mutation(f"truncate to {end}", lambda data: data[:end])
    entries = _entries(original)
    index = draw(st.integers(0, len(entries) - 1))
    name = entries[index][0].filename
    if kind == "inflate":  # the entry's bytes followed by 16 MiB of zeros, deflated to ~16 kB
        lie = draw(st.booleans())  # the directory keeps the old size: the stream inflates past it

        def inflate(data: bytes) -> bytes:
            rows = [(i.filename, c, i.compress_type) for i, c in _entries(data)]
            rows[index] = (name, rows[index][1] + bytes(16 << 20), zipfile.ZIP_DEFLATED)
            out = _rezip(rows)
            if lie:
                out = _central_size(out, name, len(entries[index][1]))
            return out

        return Mutation(f"inflate {name}{' (size hidden)' if lie else ''}", inflate)
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 1 << 40), min_size=rank, max_size=rank)))
    if draw(st.booleans()):  # often a shape of the member's own byte count
        shape = tuple(draw(st.lists(st.integers(0, 64), min_size=rank, max_size=rank)))
    descr = draw(st.sampled_from(DTYPES))
    old = entries[index][1]
    data_bytes = len(_npy_data(old)) if old.startswith(b"\x93NUMPY") else -1
    declared = int(np.prod(shape, dtype=object)) * np.dtype(descr).itemsize if descr != "|O" else -2

    def reheader(data: bytes) -> bytes:
        rows = [(i.filename, c, i.compress_type) for i, c in _entries(data)]
        content = rows[index][1]
        body = _npy_data(content) if content.startswith(b"\x93NUMPY") else content
        rows[index] = (name, _npy_header(shape, descr) + body, rows[index][2])
        return _rezip(rows)

    return Mutation(f"reheader {name} as {descr} {shape}", reheader, same_bytes=declared == data_bytes)


def _central_size(data: bytes, name: str, size: int) -> bytes:
    """``data`` (a zip) with entry ``name``'s uncompressed size in the central directory set to
    ``size`` (a lie: its stream inflates to more)."""
    out = bytearray(data)
    at = out.index(b"PK\x01\x02")
    while out[at + 46 : at + 46 + len(name)] != name.encode():
        at = out.index(b"PK\x01\x02", at + 4)
    out[at + 24 : at + 28] = size.to_bytes(4, "little")
    return bytes(out)


# ------------------------------------------------------------------------------------ readers


@dataclasses.dataclass
class Reader:
    """A reader under test: ``read(path)`` gives comparable results; ``refusals`` are its one
    line errors; ``bound(original)`` its memory bound for a mutation of ``original``."""

    name: str
    original: bytes
    read: Callable[[str], Any]
    refusals: tuple[type[BaseException], ...]
    npy_members: bool = True
    digest: bool = False  # results are vouched for by a digest: no other valid file
    bound: Callable[[bytes], int] = lambda original: FACTOR * _content(original) + SLACK


def _content(data: bytes) -> int:
    """The bytes ``data``'s entries hold."""
    return sum(len(c) for _, c in _entries(data))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return type(a) is type(b) and a == b


def _fid_reference(tmp: pathlib.Path) -> Reader:
    path = tmp / "fid-ref.npz"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 16))
    save_reference(
        str(path), x.mean(0), np.cov(x, rowvar=False), resolution=(8, 8), num_images=40, detector="d"
    )
    return Reader("FID reference", path.read_bytes(), lambda p: load_reference(p, dim=16), (FidInputError,))


def _adm_reference(tmp: pathlib.Path) -> Reader:
    path = tmp / "adm-ref.npz"
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    pool = rng.normal(size=(6, adm.POOL_DIM)).astype(np.float32)
    arrays = {"arr_0": images, "pool": pool, "resolution": np.asarray((8, 8)), "num_images": np.int64(6)}
    np.savez(path, **arrays, detector=np.str_("d"))

    def read(p: str) -> Any:
        out = adm.read_reference_batch(p)
        images = out.pop("images")
        return {**out, "arr_0": list(images.batches(4))}  # streamed to the end: the CRC-32 checked

    return Reader("ADM reference", path.read_bytes(), read, (adm.ReferenceBatchError,))


SETTINGS = {"num_images": 11, "chunk": 5, "first_seed": 20, "detector": "proj"}


def _progress(tmp: pathlib.Path) -> Reader:
    sums = MomentSums()
    sums.add(np.random.default_rng(2).normal(size=(10, 6)))
    fid_progress.write_progress(str(tmp), SETTINGS, 2, sums)
    original = (tmp / fid_progress.PROGRESS_FILE).read_bytes()

    def read(p: str) -> Any:
        """What a draw does: ``FidTally.resume``; a damaged file set aside is ``SetAside``."""
        outdir = os.path.dirname(p)
        shutil.copy(p, os.path.join(outdir, fid_progress.PROGRESS_FILE))
        tally = fid_progress.FidTally(6)
        done = tally.resume(outdir, SETTINGS)
        if os.path.exists(os.path.join(outdir, fid_progress.PROGRESS_FILE)):
            return {
                "done": done,
                "count": tally.sums.count,
                "total": tally.sums.total,
                "outer": tally.sums.outer,
            }
        assert done == 0 and tally.count == 0  # set aside: the draw starts over
        raise SetAside(outdir)

    return Reader("FID progress", original, read, (SetAside,), digest=True)


class SetAside(Exception):
    """The draw set the damaged progress file aside (its one line on stderr) and starts over."""


def _pt(tmp: pathlib.Path) -> Reader:
    original = (DIT / "dit_published_layout.pt").read_bytes()

    def read(p: str) -> Any:
        return dict(torch_zip.read(p))

    def bound(data: bytes) -> int:
        return Bounds(len(data)).array_bytes + SLACK

    return Reader(".pt zip", original, read, (PickleRefused,), npy_members=False, bound=bound)


def _converter_npz(tmp: pathlib.Path) -> Reader:
    original = (DIT / "dit_tiny_state_dict.npz").read_bytes()
    return Reader("converter .npz", original, read_checkpoint, (CheckpointError,))


READERS = [_fid_reference, _adm_reference, _progress, _pt, _converter_npz]


# ------------------------------------------------------------------------------------ property


@pytest.mark.parametrize("make", READERS, ids=lambda m: m.__name__.strip("_"))
def test_a_mutated_file_reads_identically_or_is_one_line_within_the_memory_bound(make, capsys):
    with tempfile.TemporaryDirectory() as tmp:
        reader = make(pathlib.Path(tmp))
        source = pathlib.Path(tmp) / ("original.npz" if reader.npy_members else "original.pt")
        source.write_bytes(reader.original)
        expected = reader.read(str(source))
        bound = reader.bound(reader.original)
        seen: list[str] = []
        peaks: list[int] = []

        @FUZZ
        @given(mutation=mutations(reader.original, reader.npy_members))
        def check(mutation: Mutation) -> None:
            with tempfile.TemporaryDirectory() as case:
                path = os.path.join(case, "mutated.npz" if reader.npy_members else "mutated.pt")
                with open(path, "wb") as f:
                    f.write(mutation.apply(reader.original))
                capsys.readouterr()
                tracemalloc.start()
                try:
                    result: Any = reader.read(path)
                    outcome = "same" if _same(result, expected) else "other"
                except reader.refusals as e:
                    outcome, result = "refused", e
                finally:
                    peak = tracemalloc.get_traced_memory()[1]
                    tracemalloc.stop()
                what = f"{reader.name}, {mutation.kind}"
                peaks.append(peak)
                assert peak <= bound, f"{what}: {peak} bytes traced, bound {bound}"
                if outcome == "other":
                    assert mutation.same_bytes and not reader.digest, f"{what}: read other results"
                if outcome == "refused":
                    line = (
                        str(result) if not isinstance(result, SetAside) else capsys.readouterr().err.strip()
                    )
                    assert "\n" not in line and case in line, f"{what}: {line!r}"
                seen.append(outcome)

        check()
        counts = dict(sorted((k, seen.count(k)) for k in set(seen)))
        print(f"{reader.name}: {counts}, peak {max(peaks)} <= {bound}")  # shown with -s
        assert len(seen) >= EXAMPLES // 2 and "refused" in seen, seen
