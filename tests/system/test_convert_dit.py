"""``python -m dew.convert_dit``: the checkpoint DiT's own code saved (random weights, tiny size,
``third_party/dit/dit_tiny_checkpoint.pt`` and its state dict as ``.npz``) becomes a dew run
whose network reproduces the reference's output, that ``dew.pipeline`` and ``python -m
dew.sample`` read; a checkpoint of another size and a patch size that does not divide the latent
resolution are one line, exit 2, nothing written."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from helpers_common import ROOT

from dew import convert_dit
from dew.inference import pipeline

DIT = ROOT / "third_party" / "dit"
GOLDEN = np.load(DIT / "dit_tiny.npz", allow_pickle=False)
NETWORK = json.loads(str(GOLDEN["config_json"]))  # DiT(input_size=8, ..., num_classes=10)


def bound(reference: np.ndarray) -> float:
    """tests/test_dit.py's float32 bound for these networks (4·12·16 u·max|out|), plus the EMA's
    debiasing (θ·(1 − β) / (1 − β): a few u relative, inside the factor 4)."""
    return 4 * 12 * 16 * 2.0**-24 * float(np.max(np.abs(reference)))


spec = importlib.util.spec_from_file_location(
    "latent_digits_data", ROOT / "experiments" / "latent_digits_data.py"
)
assert spec is not None and spec.loader is not None
data_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(data_script)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """12 digits as 32x32 RGB encoded into 8x8x(4+4) raw latents by a random-weight VAE, 10 classes."""
    root = tmp_path_factory.mktemp("latents")
    assert data_script.main([f"--dest={root}", "--max_images=12", "--random_vae"]) == 0
    return root


def overrides(data, **extra) -> list[str]:
    """experiments/dit.py shrunk to the tiny reference network and the random VAE's latents."""
    vae = data_script.VAE
    settings = {
        "dataset.path": str(data / "latents"),
        "dataset.batch_size": 4,
        "objective.latent.weights": str(data / "random_vae.safetensors"),
        "objective.latent.allow_unpinned": True,  # the random VAE has no published digest
        "objective.latent.vae_channels": tuple(vae.block_out_channels),
        "objective.latent.vae_layers_per_block": vae.layers_per_block,
        "objective.latent.vae_groups": vae.norm_num_groups,
        "objective.sampling.steps": 3,
        "model.name": "dit",
        "model.depth": NETWORK["depth"],
        "model.hidden_size": NETWORK["hidden_size"],
        "model.num_heads": NETWORK["num_heads"],
        "model.patch_size": NETWORK["patch_size"],
        "model.num_classes": NETWORK["num_classes"],
        "model.input_size": NETWORK["input_size"],
        "mesh.devices": 1,
        **extra,
    }
    return [f"--config.{k}={v if isinstance(v, str) else repr(v)}" for k, v in settings.items()]


def run(data, workdir, checkpoint, *extra, **settings) -> int:
    return convert_dit.main(
        [
            f"--checkpoint={checkpoint}",
            f"--config={ROOT / 'experiments' / 'dit.py'}:DiT-S/2",
            f"--workdir={workdir}",
            *overrides(data, **settings),
            *extra,
        ]
    )


@pytest.mark.default_compiler
@pytest.mark.parametrize("checkpoint", ["dit_tiny_state_dict.npz", "dit_tiny_checkpoint.pt"])
def test_the_references_checkpoint_becomes_a_run_that_samples(data, tmp_path, checkpoint):
    workdir = tmp_path / "run"
    assert run(data, workdir, DIT / checkpoint) == 0
    task = pipeline(str(workdir))
    assert task.step == 1 and task.options["steps"] == 3 and task.options["cfg_scale"] == 1.5
    # the restored (debiased EMA) network is the reference's: its output on the golden inputs
    x = jnp.asarray(GOLDEN["x"]).transpose(0, 2, 3, 1)
    out = task.objective._net.apply(
        task.params, None, x, jnp.asarray(GOLDEN["t"]), jnp.asarray(GOLDEN["y"]), False
    )
    np.testing.assert_allclose(out.transpose(0, 3, 1, 2), GOLDEN["out"], atol=bound(GOLDEN["out"]), rtol=0)
    done = subprocess.run(
        [sys.executable, "-m", "dew.sample", f"--workdir={workdir}", "--classes=(1,2,3)", "--cfg_scale=4.0"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    written = done.stdout.split()
    assert len(written) == 1 and os.path.isfile(written[0]) and written[0].endswith(".png")
    # python -m dew.fid --workdir reads it: the run draws decoded images by per_class and seed
    from dew.fid.inputs import draw_batches, load_run

    fid_task, _ = load_run(str(workdir))
    batches = list(draw_batches(fid_task, 12, seed=0, batch_size=8))
    assert [b.shape for b in batches] == [(8, 32, 32, 3), (2, 32, 32, 3), (2, 32, 32, 3)]
    record = json.loads((workdir / "run.json").read_text())
    assert record["converted"]["checkpoint"].endswith(checkpoint)


def test_the_model_weights_are_taken_only_when_asked(data, tmp_path):
    state = dict(np.load(DIT / "dit_tiny_state_dict.npz", allow_pickle=False))
    both = tmp_path / "train_checkpoint.npz"  # train.py's {"ema", "model"} as prefixed keys
    np.savez(
        both,
        **{f"ema/{k}": v for k, v in state.items()},
        **{f"model/{k}": v + (k != "pos_embed") for k, v in state.items()},
    )
    assert run(data, tmp_path / "ema", both) == 0
    assert run(data, tmp_path / "model", both, "--which=model") == 0
    ema, model = pipeline(str(tmp_path / "ema")), pipeline(str(tmp_path / "model"))
    w = "dit/x_embedder/proj"
    np.testing.assert_allclose(model.params[w]["bias"] - ema.params[w]["bias"], 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"model.hidden_size": 128}, "x_embedder.proj.weight has shape"),  # a state dict of another size
        ({"model.depth": 3}, "blocks.2."),
        ({"model.patch_size": 3}, "patch_size=3 does not divide"),
        ({"objective.latent.pixels": "edm2"}, "latents are of [-1, 1] images"),  # the wrong convention
        ({"objective.latent.raw_std": (2.5,) * 4}, "0.18215"),  # another scale
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(data, tmp_path, settings, message, capsys):
    workdir = tmp_path / "run"
    capsys.readouterr()
    assert run(data, workdir, DIT / "dit_tiny_state_dict.npz", **settings) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not workdir.exists()


@pytest.mark.default_compiler
def test_a_converted_dit_run_decodes_the_references_bytes(data, tmp_path):
    """The converted DiT run with the decode goldens' VAE (third_party/sd_vae/decode_goldens):
    the latents ``dew.pipeline`` hands its objective's decoder come out as ``sample_ddp.py``'s
    uint8 images (tests/test_decode_goldens.py: the tolerance and the other paths)."""
    import test_decode_goldens as goldens

    golden = {k: v for k, v in np.load(goldens.HERE / "decode_goldens.npz", allow_pickle=False).items()}
    vae = json.loads(str(golden["config"]))
    settings = {
        "objective.latent.weights": str(goldens.HERE / "tiny_vae.safetensors"),
        "objective.latent.vae_channels": tuple(vae["block_out_channels"]),
        "objective.latent.vae_layers_per_block": vae["layers_per_block"],
        "objective.latent.vae_groups": vae["norm_num_groups"],
    }
    workdir = tmp_path / "run"
    assert run(data, workdir, DIT / "dit_tiny_state_dict.npz", **settings) == 0
    task = pipeline(str(workdir))
    got = goldens.pipeline_bytes(task.objective.latent, goldens.nhwc(golden["latents"]))
    goldens.assert_bytes(got, golden["dit/uint8"], goldens.exact(golden, "dit"), goldens.delta(golden))


@pytest.mark.parametrize("experiment", ["dit.py:DiT-S/2", "sit.py:SiT-S/2"])
def test_the_experiments_train_on_latents_and_sample_decoded_images(data, tmp_path, experiment):
    """Each experiment shrunk to the tiny network and the random VAE's latents: two updates
    through the Trainer with a preview, then dew.pipeline draws decoded 32x32 RGB images."""
    from dew.config import apply_overrides, load_config
    from dew.training.trainer import Trainer

    name = "sit" if experiment.startswith("sit") else "dit"
    settings = [
        item[len("--") :]
        for item in overrides(data, **{"model.name": name, "train.num_steps": 2, "preview.every": 2})
    ]
    config = apply_overrides(load_config(f"{ROOT / 'experiments' / experiment}"), settings)
    Trainer(config, str(tmp_path / "run")).run()
    assert (tmp_path / "run" / "previews" / "samples.png").is_file()
    task = pipeline(str(tmp_path / "run"))
    assert task.step == 2 and task.options["cfg_scale"] == 1.5
    grid = task(classes=(0, 9), cfg_scale=4.0)
    assert grid.images.shape == (2, 32, 32, 3) and np.isfinite(grid.images).all()


@pytest.mark.default_compiler
def test_a_sit_state_dict_becomes_a_sit_run(data, tmp_path):
    """SiT's own network's weights (third_party/dit/sit_tiny.npz, as param/<state dict key>) as
    an .npz state dict, converted with experiments/sit.py: the run's network is SiT's forward."""
    golden = dict(np.load(DIT / "sit_tiny.npz", allow_pickle=False))
    state = {k[len("param/") :]: v.astype(np.float32) for k, v in golden.items() if k.startswith("param/")}
    path = tmp_path / "sit_state_dict.npz"
    np.savez(path, **state)
    workdir = tmp_path / "run"
    argv = [
        f"--checkpoint={path}",
        f"--config={ROOT / 'experiments' / 'sit.py'}:SiT-S/2",
        f"--workdir={workdir}",
        *overrides(data, **{"model.name": "sit", "objective.sampling.steps": 3}),
    ]
    assert convert_dit.main(argv) == 0
    task = pipeline(str(workdir))
    x = jnp.asarray(golden["x"]).transpose(0, 2, 3, 1)
    network = task.objective.network(task.params, jnp.asarray(golden["y"]))
    out = network(x, jnp.asarray(golden["t"]))
    np.testing.assert_allclose(out.transpose(0, 3, 1, 2), golden["out"], atol=bound(golden["out"]), rtol=0)
    assert task(classes=(1, 2)).images.shape == (2, 32, 32, 3)


@pytest.mark.default_compiler
def test_a_repa_checkpoint_becomes_a_run_in_sits_time(data, tmp_path, capsys):
    """REPA's train.py checkpoint (third_party/repa/repa_tiny_checkpoint.pt, REPA's own SiT) with
    ``--source=repa``: run.json's network carries ``time_direction="repa"`` and the run's network
    is −REPA(x, 1 − s) (tests/test_convert_repa.py checks the samplers and the loss); without
    ``--source`` it is one line, exit 2, nothing written."""
    repa = ROOT / "third_party" / "repa"
    golden = dict(np.load(repa / "repa_tiny_outputs.npz", allow_pickle=False))
    c = json.loads(str(golden["meta_json"]))["config"]
    settings = {
        "model.name": "sit",
        **{f"model.{k}": c[k] for k in ("depth", "hidden_size", "num_heads", "patch_size", "num_classes")},
        "model.learn_sigma": False,
        "model.encoder_depth": c["encoder_depth"],
        "model.projector_dims": tuple(c["z_dims"]),
        "model.projector_hidden": c["projector_dim"],
        "objective.sampling.steps": 3,
    }
    argv = [
        f"--checkpoint={repa / 'repa_tiny_checkpoint.pt'}",
        f"--config={ROOT / 'experiments' / 'sit.py'}:SiT-S/2",
        *overrides(data, **settings),
    ]
    refused = tmp_path / "refused"
    capsys.readouterr()
    assert convert_dit.main([*argv, f"--workdir={refused}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --source=repa" in err, err
    assert not refused.exists()
    workdir = tmp_path / "run"
    assert convert_dit.main([*argv, f"--workdir={workdir}", "--source=repa"]) == 0
    record = json.loads((workdir / "run.json").read_text())
    assert record["config"]["model"]["time_direction"] == "repa"
    task = pipeline(str(workdir))
    x = jnp.asarray(golden["x"]).transpose(0, 2, 3, 1)
    network = task.objective.network(task.params, jnp.asarray(golden["y"]))
    out = np.asarray(network(x, 1.0 - jnp.asarray(golden["t"]))).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(out, -golden["out"], atol=bound(golden["out"]), rtol=0)


# --- a checkpoint DiT's train.py saved, and the published bare state dict (make_train_checkpoint.py)

TRAINED = np.load(DIT / "dit_train_checkpoint.npz", allow_pickle=False)
TRAINED_NETWORK = json.loads(str(TRAINED["config_json"]))  # DiT(hidden_size=16, depth=2, ...)


def trained_overrides() -> dict:
    return {f"model.{k}": TRAINED_NETWORK[k] for k in ("depth", "hidden_size", "num_heads", "patch_size")}


@pytest.mark.default_compiler
@pytest.mark.parametrize(
    ("checkpoint", "which", "expected"),
    [
        ("dit_train_checkpoint.pt", None, "out_ema"),  # train.py's {"model", "ema", "opt", "args"}
        ("dit_train_checkpoint.pt", "model", "out_model"),
        ("dit_published_layout.pt", None, "out_ema"),  # DiT-XL-2-256x256.pt's bare state dict
    ],
)
def test_a_checkpoint_dits_own_code_saved_is_sampled_and_scored(
    data, tmp_path, weights_file, checkpoint, which, expected
):
    """No PyTorch in the environment: the .pt is read by dew.interop.torch_zip (its optimizer state
    and argparse args included). The run's restored network is the reference's (its output on the
    golden inputs within tests/test_dit.py's bound), ``dew.pipeline`` and ``python -m dew.sample``
    draw from it, and ``python -m dew.fid --workdir`` scores its samples."""
    workdir = tmp_path / "run"
    extra = [] if which is None else [f"--which={which}"]
    assert run(data, workdir, DIT / checkpoint, *extra, **trained_overrides()) == 0
    task = pipeline(str(workdir))
    assert task.step == 1
    x = jnp.asarray(TRAINED["x"]).transpose(0, 2, 3, 1)
    out = task.objective._net.apply(
        task.params, None, x, jnp.asarray(TRAINED["t"]), jnp.asarray(TRAINED["y"]), False
    )
    want = TRAINED[expected]
    np.testing.assert_allclose(out.transpose(0, 3, 1, 2), want, atol=bound(want), rtol=0)
    other = TRAINED["out_model" if expected == "out_ema" else "out_ema"]
    assert np.max(np.abs(other - want)) > 10 * bound(want)  # the two weight sets are told apart
    done = subprocess.run(
        [sys.executable, "-m", "dew.sample", f"--workdir={workdir}", "--classes=(1,2)", "--cfg_scale=2.0"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert os.path.isfile(done.stdout.split()[0])
    from dew.fid import main as fid_main

    stats = tmp_path / "stats.npz"
    argv = [f"--workdir={workdir}", "--num_samples=4", "--batch_size=4", f"--save_stats={stats}"]
    assert fid_main([*argv, f"--weights={weights_file}", "--allow_unpinned_weights"]) == 0
    with np.load(stats, allow_pickle=False) as saved:
        assert saved["mu"].shape == (2048,) and np.all(np.isfinite(saved["sigma"]))


def test_a_train_checkpoint_of_another_size_is_one_line_exit_2(data, tmp_path, capsys):
    """The declared network (hidden 32) and the checkpoint's (hidden 16) differ: refused, nothing written."""
    workdir = tmp_path / "run"
    capsys.readouterr()
    settings = {**trained_overrides(), "model.hidden_size": 32}
    assert run(data, workdir, DIT / "dit_train_checkpoint.pt", **settings) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x_embedder.proj.weight has shape" in err, err
    assert not workdir.exists()
