"""NVlabs/edm network pickles: read without running their code (``dew.interop.edm_pickle``),
converted into a dew run (``python -m dew.convert_edm --pickle``) whose denoiser is the
reference's, and refused (one line, exit 2, nothing written, nothing executed) when they ask for
anything else or hold no EDM network. Goldens: ``third_party/edm/make_snapshot_reference.py``."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew
from dew import convert_edm
from dew.interop.edm_config import jsonable, network_config
from dew.interop.edm_pickle import PickleRefused, RestrictedUnpickler, load_snapshot
from dew.networks.edm_weights import convert_state_dict, count_parameters

# Compares with the reference's recorded goldens: every test runs with XLA's default optimisation.
pytestmark = pytest.mark.default_compiler

THIRD_PARTY = pathlib.Path(__file__).resolve().parent.parent / "third_party" / "edm"
SNAPSHOTS = {
    "network-snapshot-tiny": "songunet",  # DDPM++, conditional, augment_dim 9, AugmentPipe
    "network-snapshot-tiny-adm": "dhariwalunet",  # ADM, conditional, use_fp16, no augmentation
}
UNIT_ROUNDOFF = 2.0**-24


def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(THIRD_PARTY / f"{name}.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_reader_recovers_the_constructor_arguments_and_weights(name):
    snapshot = load_snapshot(str(THIRD_PARTY / f"{name}.pkl"))
    ref = golden(name)
    assert snapshot.network.class_name == "EDMPrecond"
    # The arguments persistence recorded, as the reference itself reports them (net.init_kwargs).
    assert jsonable(snapshot.network.init_kwargs) == json.loads(str(ref["init_kwargs_json"]))
    inner = snapshot.network.children()["model"]
    assert jsonable(inner.init_kwargs) == json.loads(str(ref["model_init_kwargs_json"]))
    network = network_config(snapshot)
    params = convert_state_dict(
        snapshot.state_dict(), network.model["name"], network.model.get("resample_filter", (1, 1))
    )
    assert count_parameters(params) == int(ref["num_parameters"])
    assert snapshot.loss is not None and snapshot.loss.class_name == "EDMLoss"
    assert snapshot.dataset_kwargs is not None
    assert snapshot.dataset_kwargs["class_name"] == "training.dataset.ImageFolderDataset"


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_converted_pickle_denoises_like_the_reference(name, tmp_path, capsys):
    workdir = tmp_path / "converted"
    pkl = THIRD_PARTY / f"{name}.pkl"
    argv = [
        f"--pickle={pkl}",
        f"--workdir={workdir}",
        "--config.mesh.devices=1",
        "--config.dataset.batch_size=4",
    ]
    assert convert_edm.main(argv) == 0, capsys.readouterr().err
    metadata = json.loads((workdir / "run.json").read_text())
    assert metadata["config"]["model"]["name"] == SNAPSHOTS[name]
    assert metadata["converted"]["pickle"] == str(pkl) and metadata["converted"]["network"] == "EDMPrecond"

    ref = golden(name)
    x = jnp.asarray(ref["x"].transpose(0, 2, 3, 1))
    sigma = jnp.asarray(ref["sigma"])
    one_hot = ref["class_labels"]
    labels = jnp.asarray(np.where(one_hot.any(axis=1), one_hot.argmax(axis=1), -1), jnp.int32)  # -1: zeros
    expected = ref["denoised"].transpose(0, 2, 3, 1)

    task = dew.pipeline(str(workdir))  # what python -m dew.sample and python -m dew.fid load
    assert task.step == 1 and not task.raw
    denoised = jax.jit(lambda p: task.objective.denoiser(p, {"label": labels})(x, sigma))(task.params)
    # Tolerance from float32 rounding: both sides sum each output's dot products (fan-in up to
    # 9 x 64 = 576 here) in different orders through ~20 layers; independent roundings add up to
    # a relative error of about u·√(fan_in · depth) ≈ 6e-8 · 107 = 6.4e-6 per output, on outputs
    # of scale max|D| (~1.3); 4x that (4σ over 256 outputs), plus the EMA's debiasing round trip.
    tol = 4 * UNIT_ROUNDOFF * np.sqrt(576 * 20) * float(np.abs(expected).max()) + 2 * UNIT_ROUNDOFF
    np.testing.assert_allclose(np.asarray(denoised), expected, atol=tol, rtol=0)


# --- refusals ---------------------------------------------------------------------------------


def _global(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _inline(obj: object) -> bytes:
    """``obj``'s pickle opcodes without the protocol header and STOP, to splice into another."""
    return pickle.dumps(obj, protocol=2)[2:-1]


def _snapshot_of(value: bytes) -> bytes:
    """A pickle of ``{'ema': <value>}``, ``value`` being raw opcodes that push one object."""
    return b"\x80\x02}" + _inline("ema") + value + b"s."


class _RunsOnLoad:
    """Unpickling this calls ``function(*args)`` (the classic pickle payload)."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def _convert(pickle_path, workdir, capsys) -> tuple[int, str]:
    code = convert_edm.main([f"--pickle={pickle_path}", f"--workdir={workdir}", "--config.mesh.devices=1"])
    return code, capsys.readouterr().err.strip()


def test_a_pickle_asking_for_other_globals_is_refused_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "executed"
    payloads = {
        "os.system": pickle.dumps({"ema": _RunsOnLoad(os.system, f"touch {marker}")}),
        "builtins.eval": pickle.dumps(_RunsOnLoad(eval, f"open({str(marker)!r}, 'w')")),
        # Inside a tensor storage: the legacy torch.save bytes carry the payload.
        "in a storage": _snapshot_of(
            _global("torch.storage", "_load_from_bytes")
            + b"("
            + _inline(pickle.dumps(_RunsOnLoad(os.system, f"touch {marker}"), protocol=2))
            + b"tR"
        ),
    }
    # A module whose import has an effect: the unpickler must refuse it without importing it.
    (tmp_path / "importing_runs_code.py").write_text(f"open({str(marker)!r}, 'w').close()\nrun = print\n")
    sys.path.insert(0, str(tmp_path))
    try:
        payloads["an importable module"] = _snapshot_of(_global("importing_runs_code", "run") + b"(tR")
        for label, data in payloads.items():
            path = tmp_path / "evil.pkl"
            path.write_bytes(data)
            code, err = _convert(path, tmp_path / "w", capsys)
            assert code == 2, label
            assert err.startswith("error: --pickle: ") and "\n" not in err, (label, err)
            assert "refused global" in err, (label, err)
            assert not marker.exists(), label  # nothing it asked for ran
            assert not (tmp_path / "w").exists(), label  # nothing written
        assert "importing_runs_code" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))
    err_os = "refused global posix.system" if os.name == "posix" else "refused global nt.system"
    path = tmp_path / "evil.pkl"
    path.write_bytes(payloads["os.system"])
    with pytest.raises(PickleRefused, match=err_os):
        load_snapshot(str(path))


def test_a_pickle_that_is_not_an_edm_network_is_refused(tmp_path, capsys):
    cases = {
        "a plain dict": (pickle.dumps({"weights": [1.0, 2.0]}), "holds a dict with keys ['weights']"),
        "a list": (pickle.dumps([1, 2, 3]), "holds a list"),
        "not a pickle": (b"\x00not a pickle", "is not a readable pickle"),
        # A persistence record of another preconditioning (the VP baselines' VPPrecond).
        "VPPrecond": (
            _snapshot_of(
                _global("torch_utils.persistence", "_reconstruct_persistent_obj")
                + b"("
                + _inline(
                    {"type": "class", "version": 6, "module_src": "", "class_name": "VPPrecond", "state": {}}
                )
                + b"tR"
            ),
            "the network is a VPPrecond: dew converts EDMPrecond networks",
        ),
    }
    for label, (data, message) in cases.items():
        path = tmp_path / "other.pkl"
        path.write_bytes(data)
        code, err = _convert(path, tmp_path / "w", capsys)
        assert code == 2, label
        assert err.startswith("error: --pickle: ") and "\n" not in err, (label, err)
        assert message in err, (label, err)
        assert not (tmp_path / "w").exists(), label


def test_data_of_another_shape_is_refused(tmp_path, capsys):
    pkl = THIRD_PARTY / "network-snapshot-tiny.pkl"
    workdir = tmp_path / "w"
    argv = [
        f"--pickle={pkl}",
        f"--workdir={workdir}",
        "--config.mesh.devices=1",
        "--config.dataset.name=moving_digits",
    ]
    assert convert_edm.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "takes 8x8x1 images with 10 classes" in err, err
    assert not workdir.exists()


def test_tensor_layouts_and_dtypes_read_as_torch_wrote_them():
    """Offsets, strides, a shared storage, half / bfloat16 / int64 / bool, 0-d, a Parameter."""
    with open(THIRD_PARTY / "tensor-layouts.pkl", "rb") as f:
        tensors = RestrictedUnpickler(f).load()
    expected = golden("tensor-layouts")
    assert sorted(tensors) == sorted(expected)
    for key, value in expected.items():
        assert tensors[key].shape == value.shape, key
        assert tensors[key].dtype == value.dtype, key  # bfloat16 is read as float32, as stored
        np.testing.assert_array_equal(tensors[key], value, err_msg=key)


# --- hostile pickles: bounded by the file's size, one line each ----------------------------------


def _persistent(class_name: str, state: bytes) -> bytes:
    """Opcodes pushing a ``torch_utils.persistence`` object of ``class_name`` whose state is a
    dict of the key/value opcode pairs ``state``."""
    meta = {"type": "class", "version": 6, "module_src": "", "class_name": class_name}
    return (
        _global("torch_utils.persistence", "_reconstruct_persistent_obj")
        + b"("
        + _inline(meta)[:-1]  # the meta dict's SETITEMS still open: 'state' -> the state, then close
        + _inline("state")
        + b"}("
        + state
        + b"uu"
        + b"tR"
    )


def _network(net_state: bytes = b"", model_state: bytes = b"") -> bytes:
    """A snapshot whose ``ema`` is an EDMPrecond around a SongUNet, complete enough for the reader
    to reach ``net_state`` / ``model_state`` (more key/value opcode pairs of each's state)."""
    numbers = {"img_resolution": 8, "img_channels": 1, "label_dim": 0, "sigma_data": 0.5}
    numbers |= {"sigma_min": 0.0, "sigma_max": float("inf")}
    model = _persistent("SongUNet", _inline("_init_kwargs") + _inline({}) + model_state)
    net = b"".join(_inline(k) + _inline(v) for k, v in numbers.items())
    net += _inline("_modules") + b"}" + _inline("model") + model + b"s" + net_state
    if b"_init_kwargs" not in net_state:
        net += _inline("_init_kwargs") + _inline({})
    return _snapshot_of(_persistent("EDMPrecond", net))


def _legacy_storage(values: np.ndarray) -> bytes:
    """Opcodes pushing ``torch.storage._load_from_bytes(b)`` of a float32 storage holding ``values``,
    ``b`` as torch's legacy ``torch.save`` writes it."""
    from dew.interop.edm_pickle import LEGACY_MAGIC, LEGACY_PROTOCOL

    record = (
        pickle.dumps(LEGACY_MAGIC, protocol=2)
        + pickle.dumps(LEGACY_PROTOCOL, protocol=2)
        + pickle.dumps({"little_endian": True}, protocol=2)
        + b"\x80\x02("
        + _inline("storage")
        + _global("torch", "FloatStorage")
        + _inline("k0")
        + _inline("cpu")
        + _inline(int(values.size))
        + b"Nt"  # view None, TUPLE
        + b"Q."  # BINPERSID, STOP
        + pickle.dumps(["k0"], protocol=2)
        + np.int64(values.size).tobytes()
        + values.astype("<f4").tobytes()
    )
    as_bytes = pickle.dumps(record, protocol=3)[2:-1]  # BINBYTES (protocol 2 pickles bytes by a call)
    return _global("torch.storage", "_load_from_bytes") + b"(" + as_bytes + b"tR"


def _tensor(storage: bytes, size: tuple, stride: tuple) -> bytes:
    return (
        _global("torch._utils", "_rebuild_tensor_v2")
        + b"("
        + storage
        + _inline(0)
        + _inline(size)
        + _inline(stride)
        + _inline(False)
        + _inline(None)
        + b"tR"
    )


def _bounded_load(data: bytes, tmp_path, capsys) -> tuple[int, str, int]:
    """``python -m dew.convert_edm --pickle`` of ``data``: exit status, stderr, and the peak of
    the memory Python and numpy allocated meanwhile (tracemalloc)."""
    import tracemalloc

    path = tmp_path / "hostile.pkl"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        code, err = _convert(path, tmp_path / "w", capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not (tmp_path / "w").exists()
    return code, err, peak


# What reading any of these may take: the reader's own working set (a few MB for convert_edm's
# imports already done) and the file's bounded multiple, far below the hostile files' hundreds of MB.
PEAK = 32 << 20


def test_a_memo_index_far_beyond_the_file_is_refused_before_the_memo_is_sized(tmp_path, capsys):
    # 9 bytes: PROTO 2, NONE, LONG_BINPUT 2**25, STOP; CPython's unpickler would grow its memo
    # array to 2**26 pointers (512 MB) to store one None.
    data = b"\x80\x02N" + b"r" + (2**25).to_bytes(4, "little") + b"."
    code, err, peak = _bounded_load(data, tmp_path, capsys)
    assert peak < PEAK, peak
    assert code == 2 and err.startswith("error: --pickle: ") and "\n" not in err, err
    assert "memo index 33554432 after 2 opcodes" in err, err


def test_shared_references_that_expand_past_the_file_are_refused_in_one_line(tmp_path, capsys):
    nested: list = [0.0]
    for _ in range(40):  # 2**40 leaves as a reader walks them; ~200 bytes pickled
        nested = [nested, nested]
    data = _network(_inline("_init_kwargs") + _inline({"x": nested}))
    assert len(data) < 2000
    code, err, peak = _bounded_load(data, tmp_path, capsys)
    assert peak < PEAK, peak
    assert code == 2 and err.startswith("error: --pickle: ") and "\n" not in err, err
    assert "its objects expand to more than" in err and "ema._init_kwargs.x" in err, err


def test_a_stride_0_tensor_is_refused_before_it_is_allocated(tmp_path, capsys):
    # One stored float, read as an 8192 x 8192 tensor (256 MB) by repeating it (stride 0).
    tensor = _tensor(_legacy_storage(np.ones(1, np.float32)), (8192, 8192), (0, 0))
    data = _network(model_state=_inline("_parameters") + b"}" + _inline("weight") + tensor + b"s")
    assert len(data) < 1000
    code, err, peak = _bounded_load(data, tmp_path, capsys)
    assert peak < PEAK, peak
    assert code == 2 and err.startswith("error: --pickle: ") and "\n" not in err, err
    assert "holds 67108864 elements, more than its 1-element storage" in err, err


def test_a_self_referencing_argument_list_is_one_line_not_a_recursion_error(tmp_path, capsys):
    loop: list = [1]
    loop.append(loop)
    data = _network(_inline("_init_kwargs") + _inline({"channel_mult": loop}))
    code, err, _ = _bounded_load(data, tmp_path, capsys)
    assert code == 2 and err.startswith("error: --pickle: ") and "\n" not in err, err
    assert "ema._init_kwargs.channel_mult[1] refers back to a list that contains it" in err, err


def test_a_parameter_that_is_a_string_is_one_line_naming_it(tmp_path, capsys):
    data = _network(model_state=_inline("_parameters") + _inline({"weight": "not a tensor"}))
    code, err, _ = _bounded_load(data, tmp_path, capsys)
    assert code == 2 and err.startswith("error: --pickle: ") and "\n" not in err, err
    assert "the network's parameter model.weight is a str, not a tensor" in err, err


def test_the_bounds_leave_real_snapshots_alone():
    """The published layouts (a shared storage, views, bfloat16) and both tiny snapshots load
    within the bounds of their own sizes."""
    from dew.interop.edm_pickle import Bounds

    for name in ("tensor-layouts.pkl", "network-snapshot-tiny.pkl", "network-snapshot-tiny-adm.pkl"):
        with open(THIRD_PARTY / name, "rb") as f:
            reader = RestrictedUnpickler(f)
            reader.load()
        assert 0 < reader.bounds.built <= Bounds.ARRAY_FACTOR * reader.bounds.size, name
