"""dew.interop.dit_checkpoint: the references' state dicts (third_party/dit, saved by their own
code with random weights) become dew DiT parameters that reproduce the reference's outputs."""

from __future__ import annotations

import json
import re

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_dit import GOLDEN, bound, golden, nhwc, tiny

from dew import registry
from dew.interop import dit_checkpoint, torch_zip
from dew.interop.dit_checkpoint import CheckpointError, convert, read_checkpoint
from dew.schema import ConfigError

STATE_NPZ = GOLDEN / "dit_tiny_state_dict.npz"
CHECKPOINT_PT = GOLDEN / "dit_tiny_checkpoint.pt"
TRAIN_PT = GOLDEN / "dit_train_checkpoint.pt"  # make_train_checkpoint.py: train.py's full dict
PUBLISHED_PT = GOLDEN / "dit_published_layout.pt"  # its EMA as a bare state dict


def options() -> dict:
    return tiny(json.loads(str(golden("dit_tiny")["config_json"])))


@pytest.mark.default_compiler
def test_converted_npz_state_dict_reproduces_the_reference():
    ref = golden("dit_tiny")
    params = convert(read_checkpoint(STATE_NPZ), "dit", options())

    def f(x, t, y):
        return registry.models["dit"](**options())(x, t, y)

    out = hk.transform(f).apply(
        jax.tree.map(jnp.asarray, params), None, nhwc(ref["x"]), ref["t"], ref["y"].astype(np.int32)
    )
    np.testing.assert_allclose(out, nhwc(ref["out"]), atol=bound(ref["out"]), rtol=0)


def test_training_checkpoint_layouts_pick_ema(tmp_path):
    state = read_checkpoint(STATE_NPZ)
    noisy = {k: v + 1.0 for k, v in state.items()}
    path = tmp_path / "ckpt.npz"
    np.savez(
        path,
        allow_pickle=True,  # savez's default, named so that no array binds to it
        **{f"ema/{k}": v for k, v in state.items()},
        **{f"model/{k}": v for k, v in noisy.items()},
    )
    for key, value in read_checkpoint(path).items():
        np.testing.assert_array_equal(value, state[key])
    np.testing.assert_array_equal(
        read_checkpoint(path, "model")["y_embedder.embedding_table.weight"],
        noisy["y_embedder.embedding_table.weight"],
    )
    with pytest.raises(ConfigError, match="which='opt' is unknown"):
        read_checkpoint(path, "opt")


def test_torch_checkpoint_as_train_py_saves_it(monkeypatch):
    """A ``torch.save`` zip is read without PyTorch (importing it is blocked here) and without
    executing it: the same arrays as the state dict, ``ema`` unless ``model`` is asked for; a
    checkpoint with train.py's optimizer state and argparse args reads too."""
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    ema = read_checkpoint(CHECKPOINT_PT)
    state = read_checkpoint(STATE_NPZ)
    assert ema.keys() == state.keys()
    for key in state:
        np.testing.assert_array_equal(ema[key], state[key])
    model = read_checkpoint(CHECKPOINT_PT, "model")
    assert not np.array_equal(model["blocks.0.attn.qkv.weight"], state["blocks.0.attn.qkv.weight"])
    full = torch_zip.read(str(TRAIN_PT))
    assert sorted(full) == ["args", "ema", "model", "opt"]
    assert vars(full["args"])["model"] == "DiT-S/2" and full["opt"]["param_groups"][0]["lr"] == 1e-4
    assert read_checkpoint(TRAIN_PT).keys() == read_checkpoint(PUBLISHED_PT).keys()
    for key, value in read_checkpoint(TRAIN_PT).items():
        np.testing.assert_array_equal(value, read_checkpoint(PUBLISHED_PT)[key])


def rewritten(tmp_path, source, edit) -> str:
    """``source`` (a torch.save zip) with ``edit(name, bytes) -> bytes`` applied to each entry."""
    import zipfile

    out = tmp_path / "edited.pt"
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for name in zin.namelist():
            zout.writestr(name, edit(name, zin.read(name)))
    return str(out)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda n, b: b.replace(b"ccollections\nOrderedDict\n", b"cos\nsystem\n"),
            "refused global os.system",
        ),
        (lambda n, b: b[:-4] if n.endswith("/data/1") else b, "tensor storage 1: 1020 bytes for 256"),
        (lambda n, b: b"big" if n.endswith("/byteorder") else b, "saved big-endian"),
        (lambda n, b: b[:200] if n.endswith("data.pkl") else b, "is not a readable checkpoint"),
    ],
)
def test_a_pt_that_is_not_a_plain_checkpoint_is_one_line(tmp_path, edit, message):
    with pytest.raises(CheckpointError, match=message) as info:
        read_checkpoint(rewritten(tmp_path, PUBLISHED_PT, edit))
    assert "\n" not in str(info.value)
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(b"\x80\x02not a zip")
    with pytest.raises(CheckpointError, match=r"is not a zip-format torch\.save file"):
        read_checkpoint(legacy)


def test_keys_map_to_modules_and_back():
    assert dit_checkpoint.module_path("dit", "blocks.3.attn.qkv.weight") == (
        "dit/blocks_3/attn/qkv",
        "weight",
    )
    assert dit_checkpoint.module_path("dit", "module.t_embedder.mlp.0.bias") == (
        "dit/t_embedder/mlp_0",
        "bias",
    )
    assert dit_checkpoint.module_path("dit", "projectors.1.4.weight") == ("dit/projectors_1_4", "weight")
    assert dit_checkpoint._reference_key("dit", "dit/blocks_3/adaLN_modulation_1", "bias") == (
        "blocks.3.adaLN_modulation.1.bias"
    )
    params = dit_checkpoint.convert_state_dict(read_checkpoint(STATE_NPZ))
    assert params["dit/x_embedder/proj"]["weight"].shape == (2, 2, 4, 64)  # OIHW -> HWIO
    assert params["dit/blocks_0/mlp/fc1"]["weight"].shape == (64, 256)  # [out, in] -> [in, out]
    assert params["dit/y_embedder/embedding_table"]["weight"].shape == (11, 64)  # rows stay rows


def test_state_dict_of_another_size_is_one_line():
    state = read_checkpoint(STATE_NPZ)
    wider = dict(options(), hidden_size=128)
    with pytest.raises(CheckpointError) as error:
        convert(state, "dit", wider)
    message = str(error.value)
    assert "\n" not in message
    assert re.search(
        r"x_embedder\.proj\.weight has shape \(64, 4, 2, 2\), dit with .* expects \(128, 4, 2, 2\)", message
    ), message
    deeper = dict(options(), depth=3)
    with pytest.raises(
        CheckpointError,
        match=r"blocks\.2\.adaLN_modulation\.1\.bias \(shape \(384,\)\) is missing for dit with",
    ):
        convert(state, "dit", deeper)
    no_sigma = dict(options(), learn_sigma=False)
    with pytest.raises(
        CheckpointError, match=r"final_layer\.linear\.weight has shape \(32, 64\), .* expects \(16, 64\)"
    ):
        convert(state, "dit", no_sigma)
    extra = {**state, "blocks.0.attn.q_norm.weight": np.ones(16, np.float32)}
    with pytest.raises(CheckpointError, match=r"blocks\.0\.attn\.q_norm\.weight \(16,\) is not in dit"):
        convert(extra, "dit", options())


def test_patch_size_that_does_not_divide_the_latents_is_a_config_error():
    state = read_checkpoint(STATE_NPZ)
    with pytest.raises(ConfigError, match=r"input_size=7: the checkpoint's patch size 2 does not divide it"):
        convert(state, "dit", options(), input_size=7)
    shifted = {**state, "pos_embed": state["pos_embed"] + 0.1}
    with pytest.raises(CheckpointError, match="pos_embed is not the fixed 2-D sin-cos table"):
        convert(shifted, "dit", options())
    with pytest.raises(CheckpointError, match=r"pos_embed has shape \(1, 16, 64\), expected \(1, 64, 64\)"):
        convert(state, "dit", options(), input_size=16)
