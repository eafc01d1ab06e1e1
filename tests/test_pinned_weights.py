"""``dew.pinned_weights``: the digests, the ``.npz`` layout, the one-line missing-file error and the
converter command's steps that convert_inception, dinov2_weights, dinov2_vitb14_weights and
sd_vae_weights share (the two DINOv2 converters through ``run_unpinned_converter``)."""

from __future__ import annotations

import hashlib
import os
import sys
import types

import numpy as np
import pytest

from dew import pinned_weights
from dew.npz import NotAnNpzError
from dew.scoring import dinov2_vitb14_weights, dinov2_weights


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "b.weight": rng.standard_normal((3, 2)).astype(np.float32),
        "a.bias": np.arange(4, dtype=np.float32),
    }


def test_file_digest_is_the_sha256_of_the_bytes(tmp_path):
    path = tmp_path / "w.bin"
    blob = bytes(range(256)) * 5000  # 1.28 MB: more than one 1 MiB chunk
    path.write_bytes(blob)
    assert pinned_weights.file_sha256(str(path)) == hashlib.sha256(blob).hexdigest()


def test_content_digest_sees_names_dtypes_shapes_and_bytes():
    arrays = _arrays()
    digest = pinned_weights.content_sha256(arrays)
    assert (
        pinned_weights.content_sha256(dict(reversed(arrays.items()))) == digest
    )  # name order, not insertion
    changed = [
        {**arrays, "a.bias": arrays["a.bias"].astype(np.float64)},
        {**arrays, "a.bias": arrays["a.bias"].reshape(2, 2)},
        {**arrays, "a.bias": arrays["a.bias"] + np.float32(1)},
        {"c.bias" if k == "a.bias" else k: v for k, v in arrays.items()},
    ]
    assert len({digest, *(pinned_weights.content_sha256(a) for a in changed)}) == 5


def test_npz_round_trip_records_both_digests_and_refuses_damage(tmp_path):
    arrays = _arrays()
    out = tmp_path / "sub" / "w.npz"  # the folder is made
    digest = pinned_weights.write_npz(str(out), arrays, "ab" * 32)
    assert digest == pinned_weights.content_sha256(arrays)
    read, source = pinned_weights.read_npz(str(out), "Test weights")
    assert source == "ab" * 32 and sorted(read) == sorted(arrays)
    for name in arrays:
        np.testing.assert_array_equal(read[name], arrays[name])

    damaged = tmp_path / "damaged.npz"
    with np.load(out, allow_pickle=False) as data:
        kept = {k: data[k] for k in data.files}
    kept["a.bias"] = kept["a.bias"] * 2
    np.savez(damaged, **kept)
    with pytest.raises(
        ValueError, match=r"^Test weights .*damaged\.npz are damaged \(content digest mismatch\)"
    ):
        pinned_weights.read_npz(str(damaged), "Test weights")
    unsigned = tmp_path / "unsigned.npz"
    np.savez(unsigned, **arrays)  # no recorded digests at all
    with pytest.raises(ValueError, match="damaged"):
        pinned_weights.read_npz(str(unsigned), "Test weights")
    text = tmp_path / "text.npz"
    text.write_text("not an archive")
    with pytest.raises(NotAnNpzError, match="Test weights"):
        pinned_weights.read_npz(str(text), "Test weights")


def test_paths_and_the_missing_file_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DEW_TEST_WEIGHTS", "")
    assert pinned_weights.default_path("DEW_TEST_WEIGHTS", "~/w.npz") == os.path.expanduser("~/w.npz")
    present = tmp_path / "w.npz"
    present.write_bytes(b"x")
    monkeypatch.setenv("DEW_TEST_WEIGHTS", str(present))
    assert pinned_weights.default_path("DEW_TEST_WEIGHTS", "~/w.npz") == str(present)

    def fallback():
        return pinned_weights.default_path("DEW_TEST_WEIGHTS", "~/w.npz")

    assert pinned_weights.existing_file(None, fallback, "Test weights", "get them") == str(present)
    missing = tmp_path / "absent.npz"
    with pytest.raises(FileNotFoundError) as e:
        pinned_weights.existing_file(str(missing), fallback, "Test weights", "download them from X")
    assert str(e.value) == f"Test weights not found at {missing}: download them from X"


class _Tensor:
    """What ``torch.load`` gives per entry, as far as the converter uses it."""

    def __init__(self, array):
        self._array = array

    def numpy(self):
        return self._array


def _run(tmp_path, argv, refuse=lambda digest, args: None, convert=None, network=None, report_source=False):
    parser = pinned_weights.converter_parser("python -m test_converter", None, "w.pth", "~/w.npz")
    return pinned_weights.run_converter(
        parser,
        argv,
        fallback=lambda: str(tmp_path / "default.npz"),
        how_to_get="download w.pth from X",
        refuse=refuse,
        convert=convert or (lambda state, output, digest: pinned_weights.write_npz(output, state, digest)),
        network=network,
        report_source=report_source,
    )


def test_converter_command_refuses_in_one_line(tmp_path, capsys):
    missing = tmp_path / "w.pth"
    assert _run(tmp_path, [f"--input={missing}"]) == 2
    assert (
        capsys.readouterr().err == f"error: --input={str(missing)!r} does not exist; download w.pth from X\n"
    )

    source = tmp_path / "present.pth"
    source.write_bytes(b"weights")
    digest = hashlib.sha256(b"weights").hexdigest()
    assert _run(tmp_path, [f"--input={source}"], refuse=lambda d, args: f"expected {'0' * 64}") == 2
    assert (
        capsys.readouterr().err
        == f"error: --input={str(source)!r} has SHA-256 {digest}, expected {'0' * 64}\n"
    )
    assert not (tmp_path / "default.npz").exists()


def test_converter_command_writes_the_npz(tmp_path, capsys, monkeypatch):
    arrays = _arrays()
    source = tmp_path / "w.pth"
    source.write_bytes(b"the published file")
    digest = hashlib.sha256(b"the published file").hexdigest()
    loads = []

    def load(path, map_location, weights_only):  # torch.load's contract as the converter calls it
        loads.append((path, map_location, weights_only))
        return {k: _Tensor(v) for k, v in arrays.items()}

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(load=load))
    out = tmp_path / "out.npz"
    assert _run(tmp_path, [f"--input={source}", f"--output={out}"], report_source=True) == 0
    assert loads == [(str(source), "cpu", True)]
    content = pinned_weights.content_sha256(arrays)
    assert capsys.readouterr().out == f"wrote {out} (source sha256 {digest}, content sha256 {content})\n"
    read, recorded = pinned_weights.read_npz(str(out), "Test weights")
    assert recorded == digest and pinned_weights.content_sha256(read) == content

    assert _run(tmp_path, [f"--input={source}"]) == 0  # --output defaults to the fallback
    assert capsys.readouterr().out == f"wrote {tmp_path / 'default.npz'} (content sha256 {content})\n"

    def wrong_network(state, output, source_sha256):
        raise KeyError("pos_embed")

    assert _run(tmp_path, [f"--input={source}"], convert=wrong_network, network="Test net") == 2
    assert (
        capsys.readouterr().err
        == f"error: --input={str(source)!r} is not a Test net state_dict: 'pos_embed'\n"
    )
    with pytest.raises(KeyError, match="pos_embed"):  # without a network name the error is not caught
        _run(tmp_path, [f"--input={source}"], convert=wrong_network)


def test_converter_command_without_pytorch_says_so(tmp_path, capsys, monkeypatch):
    source = tmp_path / "w.pth"
    source.write_bytes(b"weights")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert _run(tmp_path, [f"--input={source}"]) == 2
    assert "converting needs PyTorch once" in capsys.readouterr().err


def _run_unpinned(tmp_path, argv, pinned=frozenset()):
    return pinned_weights.run_unpinned_converter(
        "python -m test_converter",
        None,
        "w.pth",
        "~/w.npz",
        argv,
        lambda: str(tmp_path / "default.npz"),
        "download w.pth from X",
        pinned=pinned,
        convert=lambda state, output, digest: pinned_weights.write_npz(output, state, digest),
        network="Test net",
    )


def _fake_torch(monkeypatch, arrays):
    monkeypatch.setitem(
        sys.modules,
        "torch",
        types.SimpleNamespace(
            load=lambda path, map_location, weights_only: {k: _Tensor(v) for k, v in arrays.items()}
        ),
    )


def test_an_unpinned_file_is_converted_only_when_allowed_or_pinned(tmp_path, capsys, monkeypatch):
    arrays = _arrays()
    _fake_torch(monkeypatch, arrays)
    source = tmp_path / "w.pth"
    source.write_bytes(b"no digest is published for this")
    digest = hashlib.sha256(b"no digest is published for this").hexdigest()
    out = tmp_path / "out.npz"
    assert _run_unpinned(tmp_path, [f"--input={source}", f"--output={out}"]) == 2
    assert capsys.readouterr().err == (
        f"error: --input={str(source)!r} has SHA-256 {digest}, which is not pinned (no digest of w.pth "
        "is published); pass --allow_unpinned to convert it anyway\n"
    )
    assert not out.exists()
    content = pinned_weights.content_sha256(arrays)
    wrote = f"wrote {out} (source sha256 {digest}, content sha256 {content})\n"  # the source is reported
    assert _run_unpinned(tmp_path, [f"--input={source}", f"--output={out}", "--allow_unpinned"]) == 0
    assert capsys.readouterr().out == wrote
    out.unlink()
    assert _run_unpinned(tmp_path, [f"--input={source}", f"--output={out}"], pinned=frozenset({digest})) == 0
    assert capsys.readouterr().out == wrote


@pytest.mark.parametrize(
    ("module", "network"),
    [(dinov2_weights, "DINOv2 ViT-L/14"), (dinov2_vitb14_weights, "DINOv2 ViT-B/14")],
)
def test_the_dinov2_converters_refuse_unpinned_files_and_name_their_network(
    module, network, tmp_path, capsys, monkeypatch
):
    source = tmp_path / module.SOURCE_NAME
    source.write_bytes(b"not the weights")
    out = tmp_path / "o.npz"
    assert module.main([f"--input={source}", f"--output={out}"]) == 2
    err = capsys.readouterr().err
    assert f"which is not pinned (no digest of {module.SOURCE_NAME} is published)" in err
    _fake_torch(monkeypatch, {"cls_token": np.zeros((1, 1, 4), np.float32)})
    assert module.main([f"--input={source}", f"--output={out}", "--allow_unpinned"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: --input={str(source)!r} is not a {network} state_dict: ")
        and "\n" not in err[:-1]
    )
    assert not out.exists()
