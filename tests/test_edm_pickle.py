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
