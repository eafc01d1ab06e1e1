"""Every file dew reads is untrusted (``dew.npz``, ``dew.bounded_zip``): what an attack round on
the readers found, each as it was reproduced. A damaged file is one line naming the file, the
member and what was expected, read within a bound derived from what the file should hold;
damage to dew's own progress files is set aside and redrawn."""

from __future__ import annotations

import io
import os
import pathlib
import tracemalloc
import zipfile

import numpy as np
import pytest

from dew import convert_dit
from dew.interop import dit_checkpoint, torch_zip
from dew.interop.dit_checkpoint import CheckpointError, read_checkpoint
from dew.interop.pickle_bounds import PickleRefused
from dew.scoring import fid_progress
from dew.scoring.fid_reference import FidInputError, MomentSums, load_reference, save_reference

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIT = ROOT / "third_party" / "dit"
PUBLISHED_PT = DIT / "dit_published_layout.pt"
STATE_NPZ = DIT / "dit_tiny_state_dict.npz"
SETTINGS = {"num_images": 11, "chunk": 5, "first_seed": 20, "detector": "proj"}
DIM = 6


def progress_file(outdir: pathlib.Path) -> pathlib.Path:
    """A FID progress file after 2 of 3 chunks, as a draw writes it."""
    sums = MomentSums()
    sums.add(np.random.default_rng(0).normal(size=(10, DIM)))
    fid_progress.write_progress(str(outdir), SETTINGS, 2, sums)
    return outdir / fid_progress.PROGRESS_FILE


def data_offset(path: pathlib.Path, name: str) -> tuple[int, int]:
    """(where entry ``name``'s stored bytes start in ``path``, how many there are)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n, m = np.frombuffer(f.read(4), "<u2")
    return info.header_offset + 30 + int(n) + int(m), info.compress_size


def npy_with_header(shape: tuple[int, ...], descr: str = "<f8", data: bytes = b"\0" * 64) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


def replace_member(path: pathlib.Path, name: str, content: bytes) -> None:
    with zipfile.ZipFile(path) as archive:
        entries = {n: archive.read(n) for n in archive.namelist()}
    entries[name] = content
    with zipfile.ZipFile(path, "w") as archive:
        for n, b in entries.items():
            archive.writestr(n, b)


# ------------------------------------------------------------------------------- progress files


@pytest.mark.parametrize("member", ["settings", "chunks_done", "count", "total", "outer", "digest"])
def test_a_flipped_byte_in_any_progress_member_is_set_aside_and_redrawn(tmp_path, capsys, member):
    """Found: ``zipfile.BadZipFile: Bad CRC-32``, a traceback, for each member tried."""
    path = progress_file(tmp_path)
    start, size = data_offset(path, f"{member}.npy")
    data = bytearray(path.read_bytes())
    data[start + size - 1] ^= 0x01  # the member's last byte: its data, past the .npy header
    path.write_bytes(bytes(data))
    with pytest.raises(fid_progress.ProgressDamaged, match=rf"member '{member}' cannot be read \(BadZipFile"):
        fid_progress.read_progress(str(tmp_path), SETTINGS, DIM)
    tally = fid_progress.FidTally(DIM)
    assert tally.resume(str(tmp_path), SETTINGS) == 0 and tally.count == 0
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and str(path) in line and "set it aside as" in line, line
    assert not path.exists() and len(os.listdir(tmp_path)) == 1  # the damaged file, renamed
    assert tally.resume(str(tmp_path), SETTINGS) == 0  # nothing left to stop the next draw


def test_each_damaged_progress_file_set_aside_is_kept(tmp_path, capsys):
    """Two set aside within one second (the name's resolution) are both kept."""
    for _ in range(2):
        progress_file(tmp_path).write_bytes(b"torn")
        assert fid_progress.FidTally(DIM).resume(str(tmp_path), SETTINGS) == 0
    assert len([n for n in os.listdir(tmp_path) if ".damaged-" in n]) == 2
    assert capsys.readouterr().err.count("set it aside as") == 2


def test_a_progress_member_declaring_298_gib_is_refused_before_it_is_allocated(tmp_path):
    """Found: numpy's ``_ArrayMemoryError: Unable to allocate 298 GiB``."""
    path = progress_file(tmp_path)
    replace_member(path, "outer.npy", npy_with_header((200_000, 200_000)))
    tracemalloc.start()
    try:
        with pytest.raises(
            fid_progress.ProgressDamaged, match=r"member 'outer' has shape \(200000, 200000\)"
        ):
            fid_progress.read_progress(str(tmp_path), SETTINGS, DIM)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * os.path.getsize(path) + (2 << 20), peak  # the file's bytes, never its declaration


# ---------------------------------------------------------------------------------- references


def test_a_reference_mu_declaring_gigabytes_is_one_line(tmp_path):
    path = tmp_path / "ref.npz"
    save_reference(str(path), np.zeros(4), np.eye(4), resolution=(8, 8), num_images=5, detector="d")
    replace_member(path, "mu.npy", npy_with_header((4_000_000_000,)))
    with pytest.raises(FidInputError, match=r"member 'mu' declares float64 \(4000000000,\)") as refused:
        load_reference(str(path))
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    with pytest.raises(
        FidInputError, match=r"member 'mu' has shape \(4000000000,\); expected float \[D\] \(D at most 2048\)"
    ):
        load_reference(str(path), dim=2048)


def test_what_the_fuzz_tier_found_is_one_line(tmp_path):
    """A ``.npy`` header numpy's parser stops on (its ``SyntaxError``, not a ``ValueError``), and
    a member the reader does not read whose name the zip's directory garbles (a flipped byte):
    both once escaped a longer run of tests/test_fuzz_readers.py."""
    path = tmp_path / "ref.npz"
    save_reference(str(path), np.zeros(4), np.eye(4), resolution=(8, 8), num_images=5, detector="d")
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (4,   \n"
    replace_member(
        path, "mu.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(32)
    )
    with pytest.raises(
        FidInputError, match=r"member 'mu' cannot be read \(ValueError: its .npy header cannot"
    ):
        load_reference(str(path))
    save_reference(str(path), np.zeros(4), np.eye(4), resolution=(8, 8), num_images=5, detector="d")
    np.savez(path, **dict(np.load(path)), features=np.zeros((3, 4)))  # a member load_reference ignores
    data = bytearray(path.read_bytes())
    name = data.index(b"features.npy", data.index(b"PK\x01\x02"))  # in the central directory
    data[name] ^= 0x01  # the directory now names "geatures.npy"; its local header still "features"
    path.write_bytes(bytes(data))
    with pytest.raises(FidInputError, match=r"entry 'geatures.npy' cannot be read \(BadZipFile"):
        load_reference(str(path))


@pytest.mark.parametrize(
    "edit,message",
    [
        ({"num_images": 1}, "records statistics of 1 images; a covariance needs 2"),
        ({"num_images": 0}, "records statistics of 0 images"),
        ({"mu": np.full(4, np.nan)}, "mu holds values that are not finite"),
        ({"sigma": np.full((4, 4), np.inf)}, "sigma holds values that are not finite"),
        ({"sigma": np.eye(5)}, r"member 'sigma' has shape \(5, 5\) \(D=4 elsewhere\)"),
        ({"resolution": (8, 8, 3)}, r"member 'resolution' has shape \(3,\); expected int/uint \[2\]"),
        ({"resolution": (0, 8)}, r"resolution \(0, 8\); expected \[H, W\] >= 1"),
    ],
)
def test_a_reference_that_cannot_give_a_number_is_refused_when_it_is_read(tmp_path, edit, message):
    """Found only after the whole draw: "need at least 1 feature rows", "LinAlgError:
    Eigenvalues did not converge". ``load_reference`` runs before the first sample."""
    arrays = {"mu": np.zeros(4), "sigma": np.eye(4), "resolution": (8, 8), "num_images": 5, **edit}
    path = tmp_path / "ref.npz"
    np.savez(path, allow_pickle=False, **{k: np.asarray(v) for k, v in arrays.items()})
    with pytest.raises(FidInputError, match=message) as refused:
        load_reference(str(path))
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)


# ---------------------------------------------------------------------- python -m dew.convert_dit


def _torch_zip_with(tmp_path, edit) -> pathlib.Path:
    """The published-layout ``.pt`` rewritten (stored entries), then ``edit(bytearray, archive)``."""
    out = tmp_path / "edited.pt"
    with zipfile.ZipFile(PUBLISHED_PT) as zin, zipfile.ZipFile(out, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
    data = bytearray(out.read_bytes())
    with zipfile.ZipFile(out) as archive:
        edit(data, archive, out)
    out.write_bytes(bytes(data))
    return out


def _flip_storage(data, archive, path):
    name = next(n for n in archive.namelist() if "/data/" in n)
    start, _ = data_offset(path, name)
    data[start + 3] ^= 0xFF


def _encrypt_pickle(data, archive, path):
    info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    data[info.header_offset + 6] |= 1  # the local header's "encrypted" flag, then the central one
    central = data.index(b"PK\x01\x02")
    while bytes(data[central + 46 : central + 46 + len(info.filename)]) != info.filename.encode():
        central = data.index(b"PK\x01\x02", central + 4)
    data[central + 8] |= 1


def _text(tmp_path) -> pathlib.Path:
    (tmp_path / "text.npz").write_text("these are not weights")
    return tmp_path / "text.npz"


def _npz(tmp_path, **changes) -> pathlib.Path:
    state = dict(np.load(STATE_NPZ))
    path = tmp_path / "state.npz"
    np.savez(path, **{**state, **changes})
    return path


@pytest.mark.parametrize(
    "make,message",
    [
        (
            lambda p: _torch_zip_with(p, _flip_storage),
            r"entry '\S+/data/\d+' cannot be read \(BadZipFile: Bad CRC-32",
        ),
        (lambda p: _torch_zip_with(p, _encrypt_pickle), r"entry '\S+/data.pkl' is encrypted"),
        (_text, "is not an .npz archive"),
        (lambda p: _npz(p, pos_embed=np.array([{"a": 1}], dtype=object)), "member 'pos_embed' is object"),
        (lambda p: _npz(p, pos_embed=np.array(["abc"])), "member 'pos_embed' is <U3"),
        (
            lambda p: replace_member(q := _npz(p), "pos_embed.npy", b"\x93NUMPY\x01\x00garbage") or q,
            "member 'pos_embed' cannot be read",
        ),
    ],
)
def test_a_bad_converter_input_is_one_line(tmp_path, make, message):
    """Found: ``BadZipFile`` / ``RuntimeError`` tracebacks for a ``.pt``; raw ``NotAnNpzError`` /
    ``ValueError`` for an ``.npz``."""
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as refused:
        read_checkpoint(path)
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)


@pytest.mark.parametrize(
    "proj,message",
    [
        (np.zeros(64, np.float32), r"x_embedder.proj.weight has shape \(64,\)"),  # IndexError before
        (np.zeros((64, 4, 0, 0), np.float32), r"shape \(64, 4, 0, 0\)"),  # ZeroDivisionError before
    ],
)
def test_a_bad_patch_convolution_is_one_line_and_leaves_no_workdir(tmp_path, capsys, proj, message):
    path = _npz(tmp_path, **{"x_embedder.proj.weight": proj})
    with pytest.raises(CheckpointError, match=message):
        dit_checkpoint.check_layout(read_checkpoint(path))
    workdir = tmp_path / "run"
    argv = [
        f"--checkpoint={path}",
        f"--config={ROOT / 'experiments' / 'dit.py'}:DiT-S/2",
        f"--workdir={workdir}",
    ]
    assert convert_dit.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --checkpoint=") and str(path) in err, err
    assert not workdir.exists()


def test_a_pt_whose_byteorder_entry_inflates_is_refused_within_a_few_bytes(tmp_path):
    """Found: a 4.75 MB ``.pt`` whose byte-order entry inflates to 3 GiB took 6.4 GB of memory
    before its refusal. Here 64 MiB (64 kB on disk): the read is capped at the entry's 16 bytes."""
    out = tmp_path / "bomb.pt"
    with zipfile.ZipFile(PUBLISHED_PT) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            if name.endswith("/byteorder"):
                zout.writestr(name, b"little" + b" " * (64 << 20))
            else:
                zout.writestr(name, zin.read(name))
    tracemalloc.start()
    try:
        with pytest.raises(PickleRefused, match=r"byteorder' declares 67108870 bytes; expected at most 16"):
            torch_zip.read(str(out))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < os.path.getsize(out) + (2 << 20), peak  # not the 64 MiB it inflates to


# ---------------------------------------------------------------- weights (checked by digest)


def test_weights_opened_for_their_digest_are_bounded_by_the_file_and_damage_is_one_line(tmp_path):
    """``open_npz`` (weights of any layout, checked by digest afterwards) checks every member's
    header against its entry before numpy allocates, and turns a bad CRC-32 into one line."""
    from dew.npz import NotAnNpzError, open_npz

    path = tmp_path / "weights.npz"
    np.savez(path, w=np.arange(4096.0), b=np.zeros(3))
    replace_member(path, "w.npy", npy_with_header((200_000, 200_000)))
    with pytest.raises(
        NotAnNpzError, match=r"--weights: \S+: member 'w' declares float64 \(200000, 200000\)"
    ):
        open_npz(path, "--weights")
    np.savez(path, w=np.arange(4096.0), b=np.zeros(3))
    start, size = data_offset(path, "w.npy")
    data = bytearray(path.read_bytes())
    data[start + size - 1] ^= 0x01
    path.write_bytes(bytes(data))
    crc = r"member 'w' cannot be read \(BadZipFile: Bad CRC-32"
    with pytest.raises(NotAnNpzError, match=crc) as refused, open_npz(path, "--weights") as loaded:
        loaded["w"]  # read: the CRC-32 is checked at the entry's end
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)
