"""Images PIL refuses to decode stop ``python -m dew.fid ref`` and ``python -m dew.fid --images``
with one line naming the file, exit 2, nothing written: a decompression bomb (a 200-byte PNG
whose header claims 20000×20000 pixels, past PIL's default limit of 2 × 89,478,485), and a
truncated PNG."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from PIL import Image


def _bomb_png(width: int = 20000, height: int = 20000) -> bytes:
    """A valid PNG signature and IHDR (8-bit RGB) claiming ``width`` × ``height``, one empty
    IDAT and IEND: PIL reads the size from the header and refuses before decoding anything."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )


def _folder(tmp_path, name: str, bad: bytes | None):
    folder = tmp_path / name
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), np.uint8)).save(folder / f"img{i}.png")
    if bad is not None:
        (folder / "img1.png").write_bytes(bad)  # second in sorted order
    return folder


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert captured.out == "", captured.out
    return lines[0]


def test_the_bomb_header_is_a_bomb_to_pil(tmp_path):
    (tmp_path / "b.png").write_bytes(_bomb_png())
    with pytest.raises(Image.DecompressionBombError):
        Image.open(tmp_path / "b.png")


def _truncated_png(tmp_path) -> bytes:
    Image.fromarray(np.full((8, 8, 3), 7, np.uint8)).save(tmp_path / "whole.png")
    return (tmp_path / "whole.png").read_bytes()[:-30]


@pytest.mark.parametrize("kind", ["bomb", "truncated"])
def test_ref_refuses_an_undecodable_image_in_one_line(weights_file, tmp_path, capsys, kind):
    from dew.fid import main

    bad = _bomb_png() if kind == "bomb" else _truncated_png(tmp_path)
    data = _folder(tmp_path, "data", bad)
    dest = tmp_path / "out" / "ref.npz"
    argv = [
        "ref",
        f"--data={data}",
        f"--dest={dest}",
        f"--weights={weights_file}",
        "--allow_unpinned_weights",
    ]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert f"--data='{data}': img1.png" in line, line
    if kind == "bomb":
        assert "is 400,000,000 pixels, past PIL's limit of 178,956,970" in line, line
    else:
        assert "cannot be decoded as an image" in line, line
    assert not dest.parent.exists()


@pytest.mark.parametrize("flag", ["--images", "--ref"])
def test_images_and_a_ref_folder_refuse_a_bomb_in_one_line(weights_file, tmp_path, capsys, flag):
    from dew.fid import main

    bombed = _folder(tmp_path, "bombed", _bomb_png())
    clean = _folder(tmp_path, "clean", None)
    images, ref = (bombed, clean) if flag == "--images" else (clean, bombed)
    out = tmp_path / "stats.npz"
    argv = [f"--images={images}", f"--ref={ref}", f"--save_stats={out}", f"--weights={weights_file}"]
    assert main([*argv, "--allow_unpinned_weights", "--batch_size=2"]) == 2
    line = _one_line(capsys)
    assert f"{bombed / 'img1.png'} is 400,000,000 pixels, past PIL's limit" in line, line
    assert not out.exists()


def test_a_lowered_limit_is_the_limit_named(weights_file, tmp_path, capsys, monkeypatch):
    """PIL's limit is the user's to set (``Image.MAX_IMAGE_PIXELS``): an 8×8 image past a limit
    of 2 × 20 pixels is refused the same way."""
    from dew.fid import main

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20)
    folder = _folder(tmp_path, "small", None)
    argv = ["ref", f"--data={folder}", f"--dest={tmp_path / 'r.npz'}", f"--weights={weights_file}"]
    assert main([*argv, "--allow_unpinned_weights"]) == 2
    assert "img0.png is 64 pixels, past PIL's limit of 40" in _one_line(capsys)
